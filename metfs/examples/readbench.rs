//! Reads every file under a directory with N threads and a fixed buffer, and prints one JSON
//! line: bytes, files, seconds, bytes/s, files/s. Used by `benches/core_bench.py` to read the
//! same slot natively and through the mount, so both sides use an identical reader.
//!
//! usage: readbench DIR [--threads 4] [--buf 131072] [--passes 1] [--list FILE]
//!
//! With `--list FILE` only the files named there (paths relative to DIR, one per line) are
//! read, in that order, and DIR is not walked: a sample of a large view, every lookup cold.
//!
//! With `--passes N` every file is read N times (each time opened, read to the end and closed),
//! as a training job re-reads a mini-epoch; files and bytes count every pass.

use std::io::Read;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

fn walk(dir: &std::path::Path, out: &mut Vec<PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        match e.file_type() {
            Ok(t) if t.is_dir() => walk(&p, out),
            Ok(t) if t.is_file() => out.push(p),
            _ => {}
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let dir = PathBuf::from(
        args.get(1)
            .expect("usage: readbench DIR [--threads N] [--buf B]"),
    );
    let mut threads = 4usize;
    let mut buf = 131072usize;
    let mut passes = 1usize;
    let mut list: Option<PathBuf> = None;
    let mut i = 2;
    while i < args.len() {
        match args[i].as_str() {
            "--threads" => threads = args[i + 1].parse().expect("threads"),
            "--buf" => buf = args[i + 1].parse().expect("buf"),
            "--passes" => passes = args[i + 1].parse().expect("passes"),
            "--list" => list = Some(PathBuf::from(&args[i + 1])),
            other => panic!("unknown argument {other}"),
        }
        i += 2;
    }
    let t0 = Instant::now();
    let mut files = Vec::new();
    match &list {
        Some(l) => files.extend(
            std::fs::read_to_string(l)
                .expect("--list file")
                .lines()
                .filter(|l| !l.is_empty())
                .map(|l| dir.join(l)),
        ),
        None => walk(&dir, &mut files),
    }
    let reads = files.len() * passes;
    let files = Arc::new(files);
    let next = Arc::new(AtomicUsize::new(0));
    let handles: Vec<_> = (0..threads)
        .map(|_| {
            let files = files.clone();
            let next = next.clone();
            std::thread::spawn(move || {
                let mut b = vec![0u8; buf];
                let mut bytes = 0u64;
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= reads {
                        break;
                    }
                    let p = &files[i % files.len()];
                    let mut f = std::fs::File::open(p).expect("open");
                    loop {
                        let n = f.read(&mut b).expect("read");
                        if n == 0 {
                            break;
                        }
                        bytes += n as u64;
                    }
                }
                bytes
            })
        })
        .collect();
    let bytes: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
    let secs = t0.elapsed().as_secs_f64();
    println!(
        "{{\"bytes\": {bytes}, \"files\": {}, \"secs\": {secs}, \"bytes_per_s\": {}, \"files_per_s\": {}}}",
        reads,
        bytes as f64 / secs,
        reads as f64 / secs
    );
}
