//! Manifests: a file that lists the samples of a dataset, used instead of listing the tier when
//! listing millions of files would hurt a parallel file system's metadata server.
//!
//! Two formats, chosen by extension (`.jsonl` / `.ndjson` are JSON lines, `.csv` is CSV) or, for
//! any other name, by the first non-blank character (`{` means JSON lines):
//!
//! * **CSV** with a header row, parsed by the `csv` crate, so quoted paths may hold commas,
//!   quotes, spaces and any UTF-8. Columns are found by name (case-insensitive, any order,
//!   unknown columns ignored): `path` and `size` are required; `label`, `cluster` and one of
//!   `etag` / `mtime` / `version` (all three become [`CatalogEntry::version`]) are optional, and
//!   so is `group`: files with one group value are one sample ([`read_groups`]).
//! * **JSON lines**: one object per line with the same keys; `size` is a number (or a string of
//!   digits), `label` / `cluster` / `mtime` may be strings or numbers. Blank lines are skipped.
//!
//! Every error names the file and the line (for a duplicate, both lines), because the person
//! who sees it has to find the line in a file of millions.
//!
//! Memory. [`load_catalog`] streams records straight into a [`CatalogBuilder`]: one reused
//! record buffer, no `String` per sample, plus one `u32` per sample remembering its line for
//! error messages. [`read_manifest`] returns plain [`CatalogEntry`] values and suits small
//! manifests and tests.

use std::borrow::Cow;
use std::fs::File;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use metfs_plan::budget::{footprint, Staged};
use metfs_tier::catalog::{BuildError, Catalog, CatalogBuilder, CatalogEntry};

/// Errors of the manifest module. `file` is the manifest path as given; `line` is 1-based.
#[derive(Debug, Error)]
pub enum ManifestError {
    /// The manifest could not be opened or read.
    #[error("manifest {file}: {source}")]
    Io {
        file: String,
        #[source]
        source: std::io::Error,
    },
    /// The CSV reader rejected a record (bad quoting, a row with the wrong number of fields,
    /// invalid UTF-8).
    #[error("manifest {file} line {line}: {message}")]
    Csv {
        file: String,
        line: u64,
        message: String,
    },
    /// A JSON line is not a valid object of the expected shape.
    #[error("manifest {file} line {line}: malformed JSON: {message}")]
    Json {
        file: String,
        line: u64,
        message: String,
    },
    /// A required column (CSV header) or key (JSON line) is missing.
    #[error("manifest {file} line {line}: missing required {what} `{name}`{found}")]
    Missing {
        file: String,
        line: u64,
        /// `column` for CSV, `key` for JSON lines.
        what: &'static str,
        name: &'static str,
        /// For CSV, the header that was found.
        found: String,
    },
    /// A size that is not a whole number of bytes.
    #[error("manifest {file} line {line}: size `{value}` is not a whole number of bytes")]
    BadSize {
        file: String,
        line: u64,
        value: String,
    },
    /// A path that would escape the source or is otherwise not a clean relative path.
    #[error("manifest {file} line {line}: path `{path}` is not allowed: {reason}")]
    BadPath {
        file: String,
        line: u64,
        path: String,
        reason: &'static str,
    },
    /// The same path on two lines.
    #[error(
        "manifest {file}: path `{path}` appears twice, on line {first_line} and line {second_line}"
    )]
    Duplicate {
        file: String,
        path: String,
        first_line: u64,
        second_line: u64,
    },
    /// A path that is both a sample and a directory of other samples.
    #[error("manifest {file} line {line}: `{path}` is a file, but line {inside_line} puts a sample inside it")]
    FileDirConflict {
        file: String,
        line: u64,
        path: String,
        inside_line: u64,
    },
    /// A size that takes the dataset's total past 2^64 bytes.
    #[error("manifest {file} line {line}: size {size} takes the dataset's total past 2^64 bytes (sizes count rounded up to 4 KiB blocks, as the cache stores them)")]
    TotalTooLarge { file: String, line: u64, size: u64 },
    /// More samples than a catalog can hold.
    #[error("manifest {file}: {count} samples is more than the 4,294,967,295 a catalog can hold")]
    TooMany { file: String, count: usize },
    /// Writing a manifest failed.
    #[error("writing the manifest: {0}")]
    Write(#[source] std::io::Error),
}

/// The two manifest formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ManifestFormat {
    /// CSV with a header row.
    Csv,
    /// One JSON object per line.
    Jsonl,
}

impl ManifestFormat {
    /// The format an extension names: `.csv`, or `.jsonl` / `.ndjson`; `None` otherwise.
    pub fn from_extension(path: &Path) -> Option<Self> {
        let ext = path.extension()?.to_str()?.to_ascii_lowercase();
        match ext.as_str() {
            "csv" => Some(Self::Csv),
            "jsonl" | "ndjson" => Some(Self::Jsonl),
            _ => None,
        }
    }
}

impl std::str::FromStr for ManifestFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "csv" => Ok(Self::Csv),
            "jsonl" | "ndjson" | "json" => Ok(Self::Jsonl),
            other => Err(format!("unknown manifest format `{other}` (csv or jsonl)")),
        }
    }
}

/// One record as parsed, borrowing from the reader's buffer where it can.
struct Record<'a> {
    line: u64,
    path: &'a str,
    size: u64,
    version: &'a str,
    label: Option<&'a str>,
    cluster: Option<&'a str>,
    /// The sample the file belongs to, when the manifest groups files (`group`).
    group: Option<&'a str>,
}

/// Reads every record of `path`, calling `sink` for each in file order.
fn parse(
    path: &Path,
    mut sink: impl FnMut(Record<'_>) -> Result<(), ManifestError>,
) -> Result<(), ManifestError> {
    let file = path.display().to_string();
    let io = |source| ManifestError::Io {
        file: file.clone(),
        source,
    };
    let mut reader = BufReader::with_capacity(1 << 20, File::open(path).map_err(io)?);
    let format = match ManifestFormat::from_extension(path) {
        Some(f) => f,
        None => sniff(&mut reader).map_err(io)?,
    };
    match format {
        ManifestFormat::Csv => parse_csv(&file, reader, &mut sink),
        ManifestFormat::Jsonl => parse_jsonl(&file, reader, &mut sink),
    }
}

/// JSON lines when the first non-blank byte is `{`, CSV otherwise. Looks only at what the
/// reader has buffered (1 MiB), without consuming it.
fn sniff(reader: &mut BufReader<File>) -> std::io::Result<ManifestFormat> {
    let buf = reader.fill_buf()?;
    // A UTF-8 byte-order mark is not content.
    let buf = buf.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(buf);
    Ok(match buf.iter().find(|b| !b.is_ascii_whitespace()) {
        Some(b'{') => ManifestFormat::Jsonl,
        _ => ManifestFormat::Csv,
    })
}

fn parse_size(file: &str, line: u64, value: &str) -> Result<u64, ManifestError> {
    let v = value.trim();
    if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
        return Err(ManifestError::BadSize {
            file: file.to_string(),
            line,
            value: value.to_string(),
        });
    }
    v.parse().map_err(|_| ManifestError::BadSize {
        file: file.to_string(),
        line,
        value: value.to_string(),
    })
}

fn parse_csv(
    file: &str,
    reader: impl Read,
    sink: &mut impl FnMut(Record<'_>) -> Result<(), ManifestError>,
) -> Result<(), ManifestError> {
    let mut csv = csv::ReaderBuilder::new()
        .has_headers(true)
        .flexible(false)
        .from_reader(reader);
    let csv_err = |e: csv::Error| {
        let line = e.position().map_or(0, |p| p.line());
        let message = match e.kind() {
            csv::ErrorKind::UnequalLengths {
                expected_len, len, ..
            } => format!("this row has {len} fields but the header has {expected_len}"),
            csv::ErrorKind::Utf8 { err, .. } => format!("not valid UTF-8: {err}"),
            _ => e.to_string(),
        };
        match e.into_kind() {
            csv::ErrorKind::Io(source) => ManifestError::Io {
                file: file.to_string(),
                source,
            },
            _ => ManifestError::Csv {
                file: file.to_string(),
                line,
                message,
            },
        }
    };
    let header = csv.headers().map_err(csv_err)?.clone();
    let names: Vec<String> = header
        .iter()
        .map(|h| h.trim_start_matches('\u{feff}').trim().to_ascii_lowercase())
        .collect();
    let col = |name: &str| names.iter().position(|h| h == name);
    let found = format!(" (the header has: {})", names.join(", "));
    let missing = |name: &'static str| ManifestError::Missing {
        file: file.to_string(),
        line: 1,
        what: "column",
        name,
        found: found.clone(),
    };
    let path_col = col("path").ok_or_else(|| missing("path"))?;
    let size_col = col("size").ok_or_else(|| missing("size"))?;
    let label_col = col("label");
    let cluster_col = col("cluster");
    let group_col = col("group");
    let version_col = col("etag")
        .or_else(|| col("version"))
        .or_else(|| col("mtime"));

    // One record buffer for the whole file: no allocation per row.
    let mut rec = csv::StringRecord::new();
    while csv.read_record(&mut rec).map_err(csv_err)? {
        let line = rec.position().map_or(0, |p| p.line());
        let size = parse_size(file, line, &rec[size_col])?;
        let opt = |c: Option<usize>| c.map(|c| &rec[c]).filter(|v| !v.is_empty());
        sink(Record {
            line,
            path: &rec[path_col],
            size,
            version: version_col.map_or("", |c| &rec[c]),
            label: opt(label_col),
            cluster: opt(cluster_col),
            group: opt(group_col),
        })?;
    }
    Ok(())
}

/// A JSON size: a number, or a string of digits (some exporters quote 64-bit integers).
#[derive(Deserialize)]
#[serde(untagged)]
enum JsonSize<'a> {
    Number(serde_json::Number),
    Text(#[serde(borrow)] Cow<'a, str>),
}

/// A label, cluster or mtime: a string or a number.
#[derive(Deserialize)]
#[serde(untagged)]
enum JsonScalar<'a> {
    Text(#[serde(borrow)] Cow<'a, str>),
    Number(serde_json::Number),
}

impl JsonScalar<'_> {
    fn as_str_in<'b>(&'b self, scratch: &'b mut String) -> &'b str {
        match self {
            JsonScalar::Text(t) => t,
            JsonScalar::Number(n) => {
                scratch.clear();
                use std::fmt::Write as _;
                let _ = write!(scratch, "{n}");
                scratch
            }
        }
    }
}

#[derive(Deserialize)]
struct JsonRecord<'a> {
    #[serde(borrow, default)]
    path: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    size: Option<JsonSize<'a>>,
    #[serde(borrow, default)]
    label: Option<JsonScalar<'a>>,
    #[serde(borrow, default)]
    cluster: Option<JsonScalar<'a>>,
    #[serde(borrow, default)]
    group: Option<JsonScalar<'a>>,
    #[serde(borrow, default)]
    etag: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    version: Option<JsonScalar<'a>>,
    #[serde(borrow, default)]
    mtime: Option<JsonScalar<'a>>,
}

fn parse_jsonl(
    file: &str,
    mut reader: impl BufRead,
    sink: &mut impl FnMut(Record<'_>) -> Result<(), ManifestError>,
) -> Result<(), ManifestError> {
    let mut buf = String::new();
    let (mut label_s, mut cluster_s, mut version_s) = (String::new(), String::new(), String::new());
    let mut group_s = String::new();
    let mut line = 0u64;
    loop {
        buf.clear();
        let n = reader
            .read_line(&mut buf)
            .map_err(|source| ManifestError::Io {
                file: file.to_string(),
                source,
            })?;
        if n == 0 {
            return Ok(());
        }
        line += 1;
        let text = buf.trim_start_matches('\u{feff}').trim();
        if text.is_empty() {
            continue;
        }
        let rec: JsonRecord<'_> = serde_json::from_str(text).map_err(|e| ManifestError::Json {
            file: file.to_string(),
            line,
            message: format!("{} (column {})", strip_position(&e), e.column()),
        })?;
        let missing = |name| ManifestError::Missing {
            file: file.to_string(),
            line,
            what: "key",
            name,
            found: String::new(),
        };
        let path = rec.path.as_deref().ok_or_else(|| missing("path"))?;
        let size = match rec.size.as_ref().ok_or_else(|| missing("size"))? {
            JsonSize::Number(n) => n.as_u64().ok_or_else(|| ManifestError::BadSize {
                file: file.to_string(),
                line,
                value: n.to_string(),
            })?,
            JsonSize::Text(t) => parse_size(file, line, t)?,
        };
        let version = if let Some(e) = rec.etag.as_deref() {
            e
        } else if let Some(v) = rec.version.as_ref().or(rec.mtime.as_ref()) {
            v.as_str_in(&mut version_s)
        } else {
            ""
        };
        let label = rec.label.as_ref().map(|l| l.as_str_in(&mut label_s));
        let cluster = rec.cluster.as_ref().map(|c| c.as_str_in(&mut cluster_s));
        let group = rec.group.as_ref().map(|g| g.as_str_in(&mut group_s));
        sink(Record {
            line,
            path,
            size,
            version,
            label: label.filter(|l| !l.is_empty()),
            cluster: cluster.filter(|c| !c.is_empty()),
            group: group.filter(|g| !g.is_empty()),
        })?;
    }
}

/// serde_json appends "at line L column C" about the line it was given; the manifest's own
/// line number is more useful, so drop it.
fn strip_position(e: &serde_json::Error) -> String {
    let s = e.to_string();
    match s.rfind(" at line ") {
        Some(i) => s[..i].to_string(),
        None => s,
    }
}

/// Translates a builder error (entries named by push index) into one naming manifest lines.
fn build_error(file: &str, lines: &[u32], e: BuildError) -> ManifestError {
    let line = |i: usize| u64::from(lines.get(i).copied().unwrap_or(u32::MAX));
    match e {
        BuildError::BadPath {
            index,
            path,
            reason,
        } => ManifestError::BadPath {
            file: file.to_string(),
            line: line(index),
            path,
            reason,
        },
        BuildError::Duplicate {
            first,
            second,
            path,
        } => ManifestError::Duplicate {
            file: file.to_string(),
            path,
            first_line: line(first),
            second_line: line(second),
        },
        BuildError::FileDirConflict {
            file: f,
            inside,
            path,
        } => ManifestError::FileDirConflict {
            file: file.to_string(),
            line: line(f),
            path,
            inside_line: line(inside),
        },
        BuildError::TooMany { count } => ManifestError::TooMany {
            file: file.to_string(),
            count,
        },
    }
}

/// Adds `size`'s footprint as a copy (`metfs_plan::budget::footprint`) to the running `total`,
/// or names the line where the total would overflow: every later sum of sizes or footprints
/// (planner, budget) then fits. A transform's growth is checked where it is known (the
/// planner refuses footprints whose sum overflows).
fn add_size(total: &mut u64, file: &str, line: u64, size: u64) -> Result<(), ManifestError> {
    let f = footprint(size, Staged::Copy);
    // The footprint saturates (to u64::MAX, never a whole number of blocks) for a size within
    // a block of 2^64: an overflow too.
    *total = (f != u64::MAX)
        .then(|| total.checked_add(f))
        .flatten()
        .ok_or_else(|| ManifestError::TotalTooLarge {
            file: file.to_string(),
            line,
            size,
        })?;
    Ok(())
}

/// Reads a manifest into a catalog, streaming: see the module docs for formats and memory.
/// [`Catalog::source`] is the manifest path.
pub fn load_catalog(path: &Path) -> Result<Catalog, ManifestError> {
    let file = path.display().to_string();
    let mut builder = CatalogBuilder::default();
    // Line of each record, for error messages only; saturates past u32::MAX lines.
    let mut lines: Vec<u32> = Vec::new();
    let mut total = 0u64;
    parse(path, |r| {
        add_size(&mut total, &file, r.line, r.size)?;
        lines.push(u32::try_from(r.line).unwrap_or(u32::MAX));
        builder
            .push(r.path, r.size, r.version, r.label, r.cluster)
            .map_err(|e| build_error(&file, &lines, e))?;
        Ok(())
    })?;
    builder
        .finish(&file)
        .map_err(|e| build_error(&file, &lines, e))
}

/// The manifest's explicit sample groups: `(path, group)` of each file whose `group` column
/// (or key) is set, in file order. Files of one group are one sample; a manifest without the
/// column has none. The other columns are checked as [`load_catalog`] checks them.
pub fn read_groups(path: &Path) -> Result<Vec<(String, String)>, ManifestError> {
    let mut out = Vec::new();
    parse(path, |r| {
        if let Some(g) = r.group {
            out.push((r.path.to_string(), g.to_string()));
        }
        Ok(())
    })?;
    Ok(out)
}

/// Reads a manifest into entries in file order, with every check [`load_catalog`] makes
/// (paths, duplicates, file/directory conflicts). For small manifests; large ones should use
/// [`load_catalog`].
pub fn read_manifest(path: &Path) -> Result<Vec<CatalogEntry>, ManifestError> {
    let file = path.display().to_string();
    let mut builder = CatalogBuilder::default();
    let mut lines: Vec<u32> = Vec::new();
    let mut entries = Vec::new();
    let mut total = 0u64;
    parse(path, |r| {
        add_size(&mut total, &file, r.line, r.size)?;
        lines.push(u32::try_from(r.line).unwrap_or(u32::MAX));
        builder
            .push(r.path, r.size, r.version, r.label, r.cluster)
            .map_err(|e| build_error(&file, &lines, e))?;
        entries.push(CatalogEntry {
            path: r.path.to_string(),
            size: r.size,
            version: r.version.to_string(),
            label: r.label.map(str::to_string),
            cluster: r.cluster.map(str::to_string),
            meta: None,
        });
        Ok(())
    })?;
    builder
        .finish(&file)
        .map_err(|e| build_error(&file, &lines, e))?;
    Ok(entries)
}

#[derive(Serialize)]
struct JsonOut<'a> {
    path: &'a str,
    size: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    label: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    cluster: Option<&'a str>,
    #[serde(skip_serializing_if = "str::is_empty")]
    version: &'a str,
}

/// Writes `catalog` as a manifest that [`load_catalog`] reads back to an equal catalog (apart
/// from [`Catalog::source`] and directory stamps): `path`, `size`, then `label` and `cluster`
/// when the catalog has them and `version` when any sample has one.
pub fn write_manifest(
    catalog: &Catalog,
    out: &mut impl Write,
    format: ManifestFormat,
) -> Result<(), ManifestError> {
    let labels = catalog.labels();
    let clusters = catalog.clusters();
    let versions = (0..catalog.len() as u32).any(|i| !catalog.version(i).is_empty());
    let mut path = String::new();
    let fill_path = |id: u32, path: &mut String| {
        let (d, n) = catalog.dir_and_name(id);
        path.clear();
        if !d.is_empty() {
            path.push_str(d);
            path.push('/');
        }
        path.push_str(n);
    };
    match format {
        ManifestFormat::Csv => {
            let mut w = csv::Writer::from_writer(out);
            let mut header = vec!["path", "size"];
            if labels.is_some() {
                header.push("label");
            }
            if clusters.is_some() {
                header.push("cluster");
            }
            if versions {
                header.push("version");
            }
            let werr = |e: csv::Error| match e.into_kind() {
                csv::ErrorKind::Io(e) => ManifestError::Write(e),
                other => ManifestError::Write(std::io::Error::other(format!("{other:?}"))),
            };
            w.write_record(&header).map_err(werr)?;
            let mut size = String::new();
            for id in 0..catalog.len() as u32 {
                fill_path(id, &mut path);
                size.clear();
                use std::fmt::Write as _;
                let _ = write!(size, "{}", catalog.size(id));
                w.write_field(&path).map_err(werr)?;
                w.write_field(&size).map_err(werr)?;
                if let Some(l) = labels {
                    w.write_field(catalog.label_name(l[id as usize]))
                        .map_err(werr)?;
                }
                if let Some(c) = clusters {
                    w.write_field(catalog.cluster_name(c[id as usize]))
                        .map_err(werr)?;
                }
                if versions {
                    w.write_field(catalog.version(id)).map_err(werr)?;
                }
                w.write_record(None::<&[u8]>).map_err(werr)?;
            }
            w.flush().map_err(ManifestError::Write)?;
        }
        ManifestFormat::Jsonl => {
            for id in 0..catalog.len() as u32 {
                fill_path(id, &mut path);
                let rec = JsonOut {
                    path: &path,
                    size: catalog.size(id),
                    label: labels.map(|l| catalog.label_name(l[id as usize])),
                    cluster: clusters.map(|c| catalog.cluster_name(c[id as usize])),
                    version: catalog.version(id),
                };
                serde_json::to_writer(&mut *out, &rec)
                    .map_err(|e| ManifestError::Write(std::io::Error::other(e)))?;
                out.write_all(b"\n").map_err(ManifestError::Write)?;
            }
            out.flush().map_err(ManifestError::Write)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &tempfile::TempDir, name: &str, body: &str) -> std::path::PathBuf {
        let p = dir.path().join(name);
        std::fs::write(&p, body).unwrap();
        p
    }

    #[test]
    fn sizes_whose_total_overflows_name_the_line() {
        let d = tempfile::tempdir().unwrap();
        let max = u64::MAX;
        // Rounding alone overflows.
        let e = err(&d, "a.csv", &format!("path,size\na,1\nb,{max}\n"));
        assert!(e.contains("line 3") && e.contains(&max.to_string()), "{e}");
        // The sum overflows on the third line.
        let half = 1u64 << 63;
        let e = err(
            &d,
            "b.jsonl",
            &format!("{{\"path\":\"a\",\"size\":{half}}}\n{{\"path\":\"b\",\"size\":0}}\n{{\"path\":\"c\",\"size\":{half}}}\n"),
        );
        assert!(e.contains("line 3") && e.contains("2^64"), "{e}");
        // The largest total that fits is accepted.
        let p = write(&d, "c.csv", &format!("path,size\na,{}\n", max - 4095));
        assert_eq!(load_catalog(&p).unwrap().size(0), max - 4095);
    }

    fn err(dir: &tempfile::TempDir, name: &str, body: &str) -> String {
        let p = write(dir, name, body);
        let e = load_catalog(&p).unwrap_err().to_string();
        assert!(e.contains(&p.display().to_string()), "no file name in: {e}");
        assert_eq!(
            read_manifest(&p).unwrap_err().to_string(),
            e,
            "read_manifest and load_catalog disagree"
        );
        e
    }

    #[test]
    fn csv_with_quotes_unicode_and_optional_columns() {
        let dir = tempfile::tempdir().unwrap();
        let p = write(
            &dir,
            "m.csv",
            "Size,path,label,etag,extra\n\
             10,\"b/with, comma.jpg\",dog,e1,x\n\
             20,\"a/x y \"\"q\"\" é.png\",cat,,y\n\
             30,top,,e3,z\n",
        );
        let cat = load_catalog(&p).unwrap();
        assert_eq!(cat.len(), 3);
        assert_eq!(cat.path(0), "a/x y \"q\" é.png");
        assert_eq!(cat.path(1), "b/with, comma.jpg");
        assert_eq!(cat.size(1), 10);
        assert_eq!(cat.version(1), "e1");
        let l = cat.labels().unwrap();
        assert_eq!(cat.label_name(l[0]), "cat");
        assert_eq!(cat.label_name(l[2]), "");
        let entries = read_manifest(&p).unwrap();
        assert_eq!(entries[0].path, "b/with, comma.jpg");
        assert_eq!(entries[2].label, None);
        assert_eq!(cat.source(), p.display().to_string());
    }

    #[test]
    fn jsonl_by_extension_and_by_sniffing() {
        let dir = tempfile::tempdir().unwrap();
        let body = "\n{\"path\": \"a/1\", \"size\": 5, \"label\": 3, \"cluster\": \"k\", \"mtime\": 1700}\n\
                    {\"path\": \"a/2\", \"size\": \"6\", \"etag\": \"\\\"abc\\\"\", \"other\": [1]}\n\n";
        for name in ["m.jsonl", "m.ndjson", "manifest.txt"] {
            let cat = load_catalog(&write(&dir, name, body)).unwrap();
            assert_eq!(cat.len(), 2);
            assert_eq!(cat.label_name(cat.labels().unwrap()[0]), "3");
            assert_eq!(cat.label_name(cat.labels().unwrap()[1]), "");
            assert_eq!(cat.cluster_name(cat.clusters().unwrap()[0]), "k");
            assert_eq!(cat.version(0), "1700");
            assert_eq!(cat.version(1), "\"abc\"");
            assert_eq!(cat.size(1), 6);
        }
        // CSV without a telling extension is sniffed as CSV.
        let cat = load_catalog(&write(&dir, "list", "path,size\nx,1\n")).unwrap();
        assert_eq!(cat.path(0), "x");
    }

    #[test]
    fn errors_name_file_and_line() {
        let dir = tempfile::tempdir().unwrap();
        let e = err(&dir, "a.csv", "path,bytes\nx,1\n");
        assert!(
            e.contains("line 1") && e.contains("`size`") && e.contains("path, bytes"),
            "{e}"
        );
        let e = err(&dir, "b.csv", "path,size\nx,1\ny,12k\n");
        assert!(e.contains("line 3") && e.contains("`12k`"), "{e}");
        let e = err(&dir, "c.csv", "path,size\nx,1\ny,-4\n");
        assert!(e.contains("line 3"), "{e}");
        let e = err(&dir, "d.csv", "path,size\na/x,1\nb,2\na/x,3\n");
        assert!(
            e.contains("line 2") && e.contains("line 4") && e.contains("a/x"),
            "{e}"
        );
        for (i, bad) in ["../up", "/abs", "a//b", "a/./b", "a/../b", "a/", ""]
            .iter()
            .enumerate()
        {
            let body = format!("path,size\nok,1\n\"{bad}\",2\n");
            let e = err(&dir, &format!("p{i}.csv"), &body);
            assert!(
                e.contains("line 3") && e.contains("not allowed"),
                "{bad}: {e}"
            );
        }
        let e = err(&dir, "e.csv", "path,size\na,1\nq,2\na/b/c,3\n");
        assert!(e.contains("line 2") && e.contains("line 4"), "{e}");
        let e = err(&dir, "f.csv", "path,size\nx,1,extra\n");
        assert!(e.contains("line 2") && e.contains("fields"), "{e}");
        let e = err(
            &dir,
            "g.jsonl",
            "{\"path\":\"x\",\"size\":1}\n{\"path\": \"y\", size: 2}\n",
        );
        assert!(e.contains("line 2") && e.contains("malformed JSON"), "{e}");
        let e = err(
            &dir,
            "h.jsonl",
            "{\"path\":\"x\",\"size\":1}\n\n{\"size\": 2}\n",
        );
        assert!(e.contains("line 3") && e.contains("`path`"), "{e}");
        let e = err(&dir, "i.jsonl", "{\"path\":\"x\",\"size\":1.5}\n");
        assert!(e.contains("line 1") && e.contains("1.5"), "{e}");
        let e = err(
            &dir,
            "j.jsonl",
            "{\"path\":\"x\",\"size\":1}\n{\"path\":\"x\",\"size\":1}\n",
        );
        assert!(e.contains("line 1") && e.contains("line 2"), "{e}");
        let missing = dir.path().join("nope.csv");
        let e = load_catalog(&missing).unwrap_err().to_string();
        assert!(e.contains("nope.csv"), "{e}");
    }

    #[test]
    fn write_then_read_gives_the_same_catalog() {
        let dir = tempfile::tempdir().unwrap();
        let mut entries = vec![
            CatalogEntry::new("b/2", 2),
            CatalogEntry::new("a/x, \"y\" é", 3),
            CatalogEntry::new("top", 4),
        ];
        entries[0].label = Some("dog".into());
        entries[1].label = Some("cat,1".into());
        entries[2].cluster = Some("7".into());
        entries[1].version = "etag-1".into();
        let cat = Catalog::from_entries("src", entries).unwrap();
        for (fmt, name) in [
            (ManifestFormat::Csv, "o.csv"),
            (ManifestFormat::Jsonl, "o.jsonl"),
        ] {
            let mut buf = Vec::new();
            write_manifest(&cat, &mut buf, fmt).unwrap();
            let p = write(&dir, name, std::str::from_utf8(&buf).unwrap());
            let back = load_catalog(&p).unwrap();
            assert_eq!(back.len(), cat.len());
            for id in 0..cat.len() as u32 {
                assert_eq!(back.path(id), cat.path(id));
                assert_eq!(back.size(id), cat.size(id));
                assert_eq!(back.version(id), cat.version(id));
                let name = |c: &Catalog, id: u32| {
                    c.labels().map(|l| c.label_name(l[id as usize]).to_string())
                };
                assert_eq!(name(&back, id), name(&cat, id));
                let cl = |c: &Catalog, id: u32| {
                    c.clusters()
                        .map(|l| c.cluster_name(l[id as usize]).to_string())
                };
                assert_eq!(cl(&back, id), cl(&cat, id));
            }
        }
        // No labels, clusters or versions: only the two required columns.
        let plain = Catalog::from_entries("s", vec![CatalogEntry::new("x", 1)]).unwrap();
        let mut buf = Vec::new();
        write_manifest(&plain, &mut buf, ManifestFormat::Csv).unwrap();
        assert_eq!(String::from_utf8(buf).unwrap(), "path,size\nx,1\n");
    }

    #[test]
    fn unsorted_input_gets_sorted_ids_and_path_ordered_classes() {
        let dir = tempfile::tempdir().unwrap();
        let p = write(
            &dir,
            "u.csv",
            "path,size,label\nz/1,1,zz\na/2,2,aa\nm/3,3,mm\na/1,4,aa\n",
        );
        let cat = load_catalog(&p).unwrap();
        let paths: Vec<String> = (0..4).map(|i| cat.path(i)).collect();
        assert_eq!(paths, ["a/1", "a/2", "m/3", "z/1"]);
        assert_eq!(cat.labels().unwrap(), &[0, 0, 1, 2]);
        assert_eq!(cat.label_names(), &["aa", "mm", "zz"]);
    }

    #[test]
    fn groups_are_read_from_either_format() {
        let d = tempfile::tempdir().unwrap();
        let csv = write(
            &d,
            "m.csv",
            "path,size,group\nimages/1.png,3,1\nmasks/1.png,2,1\nclasses.txt,4,\n",
        );
        assert_eq!(
            read_groups(&csv).unwrap(),
            vec![
                ("images/1.png".to_string(), "1".to_string()),
                ("masks/1.png".to_string(), "1".to_string())
            ]
        );
        let jl = write(
            &d,
            "m.jsonl",
            "{\"path\": \"a\", \"size\": 1, \"group\": 7}\n{\"path\": \"b\", \"size\": 1}\n",
        );
        assert_eq!(
            read_groups(&jl).unwrap(),
            vec![("a".to_string(), "7".to_string())]
        );
        let plain = write(&d, "p.csv", "path,size\na,1\n");
        assert!(read_groups(&plain).unwrap().is_empty());
    }

    #[test]
    fn format_names() {
        assert_eq!("CSV".parse::<ManifestFormat>(), Ok(ManifestFormat::Csv));
        assert_eq!(
            "ndjson".parse::<ManifestFormat>(),
            Ok(ManifestFormat::Jsonl)
        );
        assert!("xml".parse::<ManifestFormat>().is_err());
        assert_eq!(
            ManifestFormat::from_extension(Path::new("x.JSONL")),
            Some(ManifestFormat::Jsonl)
        );
        assert_eq!(ManifestFormat::from_extension(Path::new("x")), None);
    }
}
