//! HDF5 per-sample labels and container staging against files written by h5py
//! (`tests/h5/make_h5.py`), whose bundled HDF5 differs from the system libhdf5 this crate
//! links; staged files are read back and compared row by row with h5py as well.

// The files are read through libhdf5, which a build without the `hdf5` feature does not link.
#![cfg(feature = "hdf5")]

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Once;

use metfs_plan::planner::{plan_epoch, PlanConfig, SampleSet, Strategy};
use metfs_prefetcher::hdf5::{
    open_containers, read_scalar_labels, stage_rows, Containers, Hdf5Error,
};
use metfs_tier::pacer::Pacer;
use rand::seq::SliceRandom;
use rand::SeedableRng;

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/h5/make_h5.py")
}

/// Makes sure h5py is importable, installing it with pip once if it is not.
fn need_h5py() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let ok = |()| {
            Command::new("python3")
                .args(["-c", "import h5py, numpy"])
                .status()
                .is_ok_and(|s| s.success())
        };
        if !ok(()) {
            let _ = Command::new("python3")
                .args(["-m", "pip", "install", "--quiet", "h5py", "numpy"])
                .status();
        }
        assert!(
            ok(()),
            "these tests need h5py and numpy: pip install h5py numpy"
        );
    });
}

fn py(args: &[&str]) -> String {
    need_h5py();
    // Tests run on parallel threads, and libhdf5 opens files without O_CLOEXEC (the library
    // marks them close-on-exec right after, but a helper forked in between keeps the
    // descriptor and its flock for its whole life). h5py in a later helper would then find
    // its file locked (EAGAIN); the helpers need no locks, so they take none.
    let out = Command::new("python3")
        .arg(script())
        .args(args)
        .env("HDF5_USE_FILE_LOCKING", "FALSE")
        .output()
        .expect("run python3");
    assert!(
        out.status.success(),
        "make_h5.py {args:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn containers_dir() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    py(&["containers", d.path().to_str().unwrap()]);
    d
}

fn strings(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// Stages `rows` of file `file` and has h5py check the result against the source.
fn stage_and_check(c: &Containers, file: usize, rows: &[u64], out: &Path) -> u64 {
    let bytes = stage_rows(c, file, rows, out, &Pacer::unlimited()).unwrap();
    assert_eq!(bytes, std::fs::metadata(out).unwrap().len());
    let rows_json = out.with_extension("rows.json");
    std::fs::write(&rows_json, serde_json::to_string(rows).unwrap()).unwrap();
    let src = c.root().join(&c.files()[file].path);
    let msg = py(&[
        "check",
        src.to_str().unwrap(),
        out.to_str().unwrap(),
        rows_json.to_str().unwrap(),
    ]);
    assert!(msg.starts_with("OK"), "{msg}");
    bytes
}

#[test]
fn per_sample_labels_from_datasets_and_attributes() {
    need_h5py();
    let d = tempfile::tempdir().unwrap();
    py(&["persample", d.path().to_str().unwrap()]);
    let got = read_scalar_labels(
        d.path(),
        strings(&["a.h5", "b.h5", "c.h5", "d.h5", "g.h5"]).into_iter(),
        "label",
    )
    .unwrap();
    assert_eq!(got, ["3", "cat", "dog", "0.1", "TRUE"]);
    // A nested dataset wins over nothing; the attribute of the same file is not consulted.
    let got = read_scalar_labels(d.path(), strings(&["h.h5"]).into_iter(), "meta/label").unwrap();
    assert_eq!(got, ["7"]);
    let got = read_scalar_labels(d.path(), strings(&["h.h5"]).into_iter(), "label").unwrap();
    assert_eq!(got, ["not this one"]);

    let err = |files: &[&str], name: &str| {
        read_scalar_labels(d.path(), strings(files).into_iter(), name).unwrap_err()
    };
    let e = err(&["a.h5", "e.h5"], "label");
    assert!(
        matches!(e, Hdf5Error::Label { ref file, .. } if file == "e.h5"),
        "{e}"
    );
    assert!(
        e.to_string().contains("e.h5") && e.to_string().contains("no such dataset"),
        "{e}"
    );
    let e = err(&["f.h5"], "label");
    assert!(
        e.to_string().contains("f.h5") && e.to_string().contains("not a scalar"),
        "{e}"
    );
    let e = err(&["notes.txt"], "label");
    assert!(
        matches!(e, Hdf5Error::NotHdf5 { ref file, .. } if file == "notes.txt"),
        "{e}"
    );
    let e = err(&["missing.h5"], "label");
    assert!(
        matches!(e, Hdf5Error::Io { ref file, .. } if file == "missing.h5"),
        "{e}"
    );
    let e = err(&["a.h5"], "x");
    assert!(
        e.to_string().contains("a.h5") && e.to_string().contains("not a scalar"),
        "{e}"
    );
}

#[test]
fn containers_choose_datasets_and_map_samples() {
    let d = containers_dir();
    let c = open_containers(
        d.path(),
        &strings(&["second.h5", "multi.h5"]),
        None,
        Some("labels"),
    )
    .unwrap();
    assert_eq!(c.samples(), 1003 + 257);
    let f = &c.files()[0];
    assert_eq!(f.path, "multi.h5");
    assert_eq!(f.rows, 1003);
    let names: Vec<&str> = f.datasets.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "be",
            "fixed",
            "grp/sub/feat",
            "images",
            "labels",
            "names",
            "pairs",
            "rgb",
            "tiles"
        ]
    );
    let images = f.datasets.iter().find(|d| d.name == "images").unwrap();
    assert_eq!(images.dtype, "float32");
    assert_eq!(images.trailing, [8, 8]);
    assert_eq!(images.chunk.as_deref(), Some(&[16u64, 8, 8][..]));
    assert_eq!(images.filters, ["shuffle", "gzip(4)"]);
    let mut attrs = images.attrs.clone();
    attrs.sort();
    assert_eq!(attrs, ["scale", "units"]);
    assert_eq!(images.row_bytes, 256);
    let names_ds = f.datasets.iter().find(|d| d.name == "names").unwrap();
    assert!(names_ds.vlen && names_ds.row_bytes > 16, "{names_ds:?}");
    let be = f.datasets.iter().find(|d| d.name == "be").unwrap();
    assert_eq!(be.dtype, "int32");
    let fixed: u64 = 256 + 8 + 3 + 40 + 8 + 256 + 4 + 10;
    assert_eq!(f.row_bytes, fixed + names_ds.row_bytes);
    assert_eq!(f.side, ["class_names", "meta_scalar"]);
    assert_eq!(f.groups, ["grp", "grp/sub"]);

    let cat = c.catalog("src").unwrap();
    assert_eq!(cat.len(), c.samples());
    assert_eq!(cat.path(0), "multi.h5/0000");
    assert_eq!(cat.path(1002), "multi.h5/1002");
    assert_eq!(cat.path(1003), "second.h5/000");
    assert_eq!(cat.size(5), c.sample_size(0));
    assert_eq!(c.sample_size(0), f.row_bytes + 8);
    let labels = cat.labels().unwrap();
    for id in [0u32, 6, 7, 1002, 1003, 1259] {
        let (file, row) = c.locate(id);
        assert_eq!(c.sample_id(file, row), id);
        assert_eq!(cat.path(id), c.sample_path(id));
        assert_eq!(cat.label_name(labels[id as usize]), (row % 7).to_string());
        assert_eq!(c.label(file, row), Some((row % 7).to_string().as_str()));
    }
    assert_eq!(
        c.rows_by_file(&[1259, 3, 1003, 1]),
        vec![(0, vec![1, 3]), (1, vec![0, 256])]
    );

    // Named datasets: only those are staged; the other row datasets are left out.
    let c = open_containers(
        d.path(),
        &strings(&["multi.h5"]),
        Some(&strings(&["/images", "labels"])),
        Some("labels"),
    )
    .unwrap();
    let f = &c.files()[0];
    assert_eq!(f.datasets.len(), 2);
    assert!(
        f.left_out.iter().any(|l| l.starts_with("rgb")),
        "{:?}",
        f.left_out
    );

    // Ties between first dimensions go to the larger one.
    let c = open_containers(d.path(), &strings(&["tie.h5"]), None, None).unwrap();
    assert_eq!(c.files()[0].rows, 6);
    assert_eq!(c.files()[0].side, ["a", "b"]);
}

#[test]
fn staged_rows_equal_source_rows() {
    let d = containers_dir();
    let c = open_containers(d.path(), &strings(&["multi.h5"]), None, Some("labels")).unwrap();
    let out = tempfile::tempdir().unwrap();
    // Four mini-epochs of random rows: 1003 does not divide evenly.
    let mut rows: Vec<u64> = (0..1003).collect();
    rows.shuffle(&mut rand::rngs::StdRng::seed_from_u64(7));
    let mut seen = vec![0u32; 1003];
    for (k, part) in rows.chunks(251).enumerate() {
        let mut part = part.to_vec();
        part.sort_unstable();
        for &r in &part {
            seen[r as usize] += 1;
        }
        stage_and_check(&c, 0, &part, &out.path().join(format!("me{k}.h5")));
    }
    assert!(seen.iter().all(|&n| n == 1));
    // Every row, no row, one row, and runs that straddle source chunks.
    let all: Vec<u64> = (0..1003).collect();
    stage_and_check(&c, 0, &all, &out.path().join("all.h5"));
    stage_and_check(&c, 0, &[], &out.path().join("none.h5"));
    stage_and_check(&c, 0, &[1002], &out.path().join("last.h5"));
    let runs: Vec<u64> = (10..40).chain(60..61).chain(900..1003).collect();
    stage_and_check(&c, 0, &runs, &out.path().join("runs.h5"));
}

#[test]
fn stratified_mini_epochs_by_label_dataset() {
    let d = containers_dir();
    let c = open_containers(
        d.path(),
        &strings(&["multi.h5", "second.h5"]),
        None,
        Some("labels"),
    )
    .unwrap();
    let cat = c.catalog("src").unwrap();
    let cfg = PlanConfig {
        strategy: Strategy::Stratified,
        seed: 3,
        slot_bytes: cat.total_bytes(),
        mini_epochs: Some(3),
        node_rank: 0,
        nodes: 1,
        cluster_copies: Default::default(),
    };
    let set = SampleSet {
        sizes: cat.sizes(),
        labels: cat.labels(),
        clusters: None,
    };
    let plan = plan_epoch(&set, &cfg, 0).unwrap();
    let out = tempfile::tempdir().unwrap();
    let mut seen: HashMap<(usize, u64), u32> = HashMap::new();
    for (k, me) in plan.mini_epochs.iter().enumerate() {
        // Each class is spread evenly: per mini-epoch counts within one of a third.
        let mut per_class: HashMap<&str, usize> = HashMap::new();
        for &s in &me.samples {
            let (f, r) = c.locate(s);
            *per_class.entry(c.label(f, r).unwrap()).or_default() += 1;
        }
        for (class, n) in per_class {
            let total = (0..c.samples() as u32)
                .filter(|&s| {
                    let (f, r) = c.locate(s);
                    c.label(f, r) == Some(class)
                })
                .count();
            assert!(n.abs_diff(total / 3) <= 1, "class {class}: {n} of {total}");
        }
        for (f, rows) in c.rows_by_file(&me.samples) {
            for &r in &rows {
                *seen.entry((f, r)).or_default() += 1;
            }
            let name = format!("me{k}-{}", c.files()[f].path);
            stage_and_check(&c, f, &rows, &out.path().join(name));
        }
    }
    assert_eq!(seen.len(), c.samples());
    assert!(seen.values().all(|&n| n == 1));
}

#[test]
fn bad_containers_are_refused_at_open() {
    let d = containers_dir();
    let open = |files: &[&str], names: Option<&[&str]>, label: Option<&str>| {
        let names = names.map(strings);
        open_containers(d.path(), &strings(files), names.as_deref(), label)
    };
    let msg = |e: Hdf5Error| e.to_string();

    let e = open(&["multi.h5", "fake.h5"], None, None).unwrap_err();
    assert!(
        matches!(e, Hdf5Error::NotHdf5 { ref file, .. } if file == "fake.h5"),
        "{e}"
    );
    let e = msg(open(&["mismatch.h5"], Some(&["a", "b"]), None).unwrap_err());
    assert!(
        e.contains("mismatch.h5") && e.contains("a: 10") && e.contains("b: 11"),
        "{e}"
    );
    let e = open(&["multi.h5"], Some(&["images", "nope"]), None).unwrap_err();
    assert!(
        matches!(e, Hdf5Error::MissingDataset { ref file, ref dataset, .. } if file == "multi.h5" && dataset == "nope"),
        "{e}"
    );
    let e = msg(open(&["multi.h5"], Some(&["grp"]), None).unwrap_err());
    assert!(e.contains("is a group"), "{e}");
    let e = msg(open(&["multi.h5"], Some(&["meta_scalar"]), None).unwrap_err());
    assert!(e.contains("meta_scalar") && e.contains("no rows"), "{e}");
    let e = open(&["refs.h5"], None, None).unwrap_err();
    assert!(
        matches!(e, Hdf5Error::Unsupported { ref file, ref dataset, .. } if file == "refs.h5" && dataset == "r"),
        "{e}"
    );
    let e = msg(open(&["lzf.h5"], None, None).unwrap_err());
    assert!(e.contains("lzf.h5") && e.contains("cannot decode"), "{e}");
    let e = msg(open(&["reserved.h5"], None, None).unwrap_err());
    assert!(e.contains("metfs_index") && e.contains("reserved"), "{e}");
    let e = open(&["label2d.h5"], None, Some("labels")).unwrap_err();
    assert!(
        matches!(e, Hdf5Error::LabelDataset { ref file, .. } if file == "label2d.h5"),
        "{e}"
    );
    assert!(e.to_string().contains("not 1-D"), "{e}");
    let e = msg(open(&["multi.h5"], None, Some("nope")).unwrap_err());
    assert!(
        e.contains("multi.h5") && e.contains("nope") && e.contains("not found"),
        "{e}"
    );
    let e = msg(open(&["mismatch.h5"], Some(&["a"]), Some("b")).unwrap_err());
    assert!(e.contains("has 11 entries") && e.contains("10 rows"), "{e}");
    let e = msg(open(&["multi.h5", "multi.h5"], None, None).unwrap_err());
    assert!(e.contains("listed twice"), "{e}");
    let e = msg(open(&["../multi.h5"], None, None).unwrap_err());
    assert!(e.contains("../multi.h5"), "{e}");
}

#[test]
fn bad_rows_and_changed_sources_are_refused_at_staging() {
    let d = containers_dir();
    let c = open_containers(d.path(), &strings(&["second.h5"]), None, None).unwrap();
    let out = tempfile::tempdir().unwrap();
    let o = out.path().join("x.h5");
    let p = Pacer::unlimited();
    for rows in [&[3u64, 2][..], &[1, 1], &[257]] {
        let e = stage_rows(&c, 0, rows, &o, &p).unwrap_err();
        assert!(matches!(e, Hdf5Error::BadRows { .. }), "{e}");
    }
    assert!(matches!(
        stage_rows(&c, 5, &[0], &o, &p),
        Err(Hdf5Error::BadRows { .. })
    ));
    // The source is rewritten after inspection: staging refuses and leaves no output behind.
    std::thread::sleep(std::time::Duration::from_millis(20));
    py(&["containers", d.path().to_str().unwrap()]);
    let e = stage_rows(&c, 0, &[0, 1], &o, &p).unwrap_err();
    assert!(
        matches!(e, Hdf5Error::SourceChanged { ref file, .. } if file == "second.h5"),
        "{e}"
    );
    assert!(!o.exists());
}

#[test]
fn paced_staging_moves_the_same_bytes() {
    let d = containers_dir();
    let c = open_containers(d.path(), &strings(&["second.h5"]), None, None).unwrap();
    let out = tempfile::tempdir().unwrap();
    let rows: Vec<u64> = (0..257).step_by(2).collect();
    // A cap well above the data: the pacer is consulted, the result unchanged.
    let p = Pacer::with_rate(Some(1 << 30));
    let o = out.path().join("paced.h5");
    stage_rows(&c, 0, &rows, &o, &p).unwrap();
    let rows_json = out.path().join("rows.json");
    std::fs::write(&rows_json, serde_json::to_string(&rows).unwrap()).unwrap();
    let src = d.path().join("second.h5");
    let msg = py(&[
        "check",
        src.to_str().unwrap(),
        o.to_str().unwrap(),
        rows_json.to_str().unwrap(),
    ]);
    assert!(msg.starts_with("OK"), "{msg}");
}
