//! HDF5 datasets: per-sample labels, and container files split into mini-epochs of rows.
//!
//! Two ways HPC training data comes in HDF5, and what this module does for each:
//!
//! * **One file per sample** (the climate benchmark of paper 001). Such files are ordinary
//!   samples for the stager; the only HDF5-specific need is a class label for stratified
//!   composition, which [`read_scalar_labels`] reads from each file: a scalar dataset, or else an
//!   attribute of the root group.
//! * **Container files** holding every sample as a row (index along axis 0) of a set of
//!   datasets. [`open_containers`] inspects them once, before anything is staged, and rejects
//!   what cannot be staged; [`Containers`] then maps rows to catalog samples; [`stage_rows`]
//!   writes, for one container and one mini-epoch, a new HDF5 file with the same structure and
//!   only the mini-epoch's rows.
//!
//! # Which datasets are rows
//!
//! With names given, exactly those datasets are the row datasets; they must all exist with rank
//! 1 or more and share their first dimension, which is the file's row count `N`. Without names,
//! every dataset in the file (groups included, hard links only) with rank 1 or more is a
//! candidate, and `N` is
//! * the length of the label dataset when one is given, else
//! * the first dimension shared by the most candidates, the larger one on a tie;
//!
//! and every candidate whose first dimension is `N` is a row dataset. The other datasets
//! ("side datasets": scalars, lookup tables such as class names) are copied whole into every
//! staged file when they hold at most [`SIDE_LIMIT`] bytes, so that user code reading them keeps
//! working; larger ones, datasets of the row count that were not named, datasets reached by soft
//! or external links, and committed datatypes are left out and listed in
//! [`ContainerFile::left_out`].
//!
//! # Sample ids
//!
//! Each row is one catalog sample named `<container path>/<row>`, the row zero-padded to the
//! number of decimal digits of `N - 1` (`train.h5/0000123` when `N` is ten million), so that
//! name order is row order. [`Containers`] keeps its files in the order the catalog sorts those
//! names (by `<path>/`, not by `<path>`: `a.h5.bak/…` sorts before `a.h5/…`), so sample id =
//! first id of the file + row, and [`Containers::locate`] / [`Containers::sample_id`] are
//! arithmetic, with no string in sight. A catalog built by [`Containers::catalog`] holds exactly
//! these samples; mixing other samples into it would shift the ids. A sample's size is the bytes
//! of its row across the row datasets (uncompressed) plus 8 for its `metfs_index` entry.
//!
//! # Staged files
//!
//! [`stage_rows`] writes one HDF5 file with the source's groups (and their attributes), the root
//! group's attributes, each row dataset under its own path with its dtype, attributes, trailing
//! shape, chunk shape (first dimension capped at the row count) and compression filters, holding
//! only the requested rows along axis 0 in ascending order, the side datasets, and a 1-D `u64`
//! dataset `metfs_index` whose entry `i` is the source row of output row `i`. Bytes are copied
//! without conversion (the file's own datatype is the memory type), so every value, byte order
//! and padding included, is the source's.
//!
//! Reading. Rows are copied in blocks of output rows. For uncompressed sources, each run of
//! neighbouring rows in a block is one regular hyperslab read straight into its place in the
//! block buffer, so only the selected rows' bytes are read (a single read of the union of the
//! runs would be fewer calls, but HDF5 1.10 maps irregular selections onto chunks element by
//! element, which cost 200 times the CPU). For compressed sources, each span of neighbouring
//! source chunks holding selected rows is read whole into a scratch buffer, so every chunk is
//! decompressed once (twice at most for a chunk straddling two blocks), and the selected rows
//! are copied out; chunks without selected rows are skipped. The source chunk cache is off:
//! with one, libhdf5 1.10.8 held memory in proportion to the chunks read. HDF5 reads one piece
//! at a time, so before a block is copied the file ranges of the next block's rows (from the
//! contiguous offset or each chunk's address) are handed to the kernel with
//! `posix_fadvise(WILLNEED)`, which keeps many reads in flight.
//!
//! Writing. Blocks are whole output chunks (a multiple of the output chunk's first dimension),
//! so every output chunk is written, and compressed, exactly once and never read back. The
//! output chunk cache is off for the same reason. After each block the output's writeback is
//! started (`sync_file_range`), so reads and writes overlap and the caller's `fsync` finds
//! little left to do.
//!
//! Memory. One block buffer of at most [`BLOCK_BYTES`] (or one output chunk, or one row, when
//! that is larger) and, for compressed sources, one scratch buffer of at most [`BLOCK_BYTES`]
//! (or one source chunk), both reused for every block of every dataset. A mini-epoch of any
//! size streams through that.
//!
//! # What cannot be staged
//!
//! Datasets of object or region references (they would point into the source file), datasets
//! compressed with a filter this HDF5 library cannot decode (e.g. h5py's `lzf`, Blosc), and a
//! source dataset named `metfs_index` at the root. Variable-length strings and sequences are
//! staged (their sizes are estimated from a sample of rows); attributes holding references are
//! skipped. Filters the library can decode but not encode are dropped from the output (recorded
//! in [`DatasetInfo::dropped_filters`]).
//!
//! # Locking
//!
//! The system libhdf5 is not thread-safe. Every call here goes through the `hdf5` crate's global
//! reentrant lock, one library call at a time, so other threads using HDF5 (through this module
//! or the crate) interleave between calls instead of racing inside the library. All functions
//! block; call them from a blocking thread.

use std::ffi::{CStr, CString};
use std::os::fd::AsRawFd;
use std::os::raw::{c_char, c_uint, c_void};
use std::path::{Path, PathBuf};

use hdf5_sys::h5::{hsize_t, H5_index_t, H5_iter_order_t};
use hdf5_sys::h5d::{self, H5D_fill_time_t, H5D_layout_t};
use hdf5_sys::h5i::hid_t;
use hdf5_sys::h5p::H5P_DEFAULT;
use hdf5_sys::h5s::{H5S_seloper_t, H5S_ALL, H5S_UNLIMITED};
use hdf5_sys::h5t::{H5T_class_t, H5T_sign_t, H5T_str_t};
use hdf5_sys::{h5a, h5f, h5g, h5i, h5l, h5o, h5p, h5s, h5t, h5z};
use thiserror::Error;

use crate::catalog::{BuildError, Catalog, CatalogBuilder};
use crate::pacer::Pacer;

/// Target size of one block of rows moved by one read and one write in [`stage_rows`], and of
/// the scratch buffer compressed sources are read through. Together they keep staging within
/// ~64 MiB of row buffers however large the mini-epoch.
pub const BLOCK_BYTES: usize = 32 << 20;

/// Side datasets (see the module docs) larger than this are left out of staged files: a copy of
/// them lands in every slot, and the budget does not count them.
pub const SIDE_LIMIT: u64 = 16 << 20;

/// Name of the dataset every staged container file gets: the source row of each output row.
pub const INDEX_DATASET: &str = "metfs_index";

/// Rows sampled to estimate the bytes per row of a variable-length dataset.
const VLEN_SAMPLE_ROWS: u64 = 1024;

/// Errors of the HDF5 module. Each names the file (a path relative to the source root, or the
/// path given) and, where there is one, the dataset.
#[derive(Debug, Error)]
pub enum Hdf5Error {
    /// The file could not be read or written at all.
    #[error("{file}: {source}")]
    Io {
        /// The file.
        file: String,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// The file exists but is not an HDF5 file, or is one too damaged to open.
    #[error("{file}: not a readable HDF5 file: {reason}")]
    NotHdf5 {
        /// The file.
        file: String,
        /// No HDF5 signature, or what the library said when opening it.
        reason: String,
    },
    /// The HDF5 library failed; `detail` is the message from its error stack.
    #[error("{file}: {what}: {detail}")]
    Library {
        /// The file.
        file: String,
        /// What was being done.
        what: String,
        /// HDF5's description of the failure.
        detail: String,
    },
    /// A per-sample label is missing, not a scalar, or of a type that makes no label.
    #[error("{file}: label `{name}`: {reason}")]
    Label {
        /// The per-sample file.
        file: String,
        /// The dataset or attribute name asked for.
        name: String,
        /// What is wrong.
        reason: String,
    },
    /// A dataset named by the caller does not exist (or is not a dataset).
    #[error("{file}: dataset `{dataset}`: {reason}")]
    MissingDataset {
        /// The container file.
        file: String,
        /// The dataset name asked for.
        dataset: String,
        /// What was found instead.
        reason: String,
    },
    /// The row datasets do not share their first dimension.
    #[error("{file}: the datasets do not share a first dimension (rows): {dims}")]
    FirstDimMismatch {
        /// The container file.
        file: String,
        /// Each dataset with its first dimension.
        dims: String,
    },
    /// A row dataset cannot be copied (references, an unavailable filter, a reserved name).
    #[error("{file}: dataset `{dataset}` cannot be staged: {reason}")]
    Unsupported {
        /// The container file.
        file: String,
        /// The dataset.
        dataset: String,
        /// Why.
        reason: String,
    },
    /// The label dataset is missing, not 1-D of length N, or of a type that makes no label.
    #[error("{file}: label dataset `{dataset}`: {reason}")]
    LabelDataset {
        /// The container file.
        file: String,
        /// The label dataset.
        dataset: String,
        /// What is wrong.
        reason: String,
    },
    /// The file has no dataset that could hold rows.
    #[error("{file}: no row datasets: {reason}")]
    NoDatasets {
        /// The container file.
        file: String,
        /// Why none qualified.
        reason: String,
    },
    /// [`stage_rows`] was given rows that are out of range or not strictly ascending, or a
    /// file index that does not exist.
    #[error("{file}: bad rows to stage: {reason}")]
    BadRows {
        /// The container file.
        file: String,
        /// What is wrong.
        reason: String,
    },
    /// The container changed on the source after [`open_containers`] inspected it.
    #[error("{file}: changed on the source since it was opened ({reason})")]
    SourceChanged {
        /// The container file.
        file: String,
        /// What differs.
        reason: String,
    },
    /// A container path is not a clean relative path, or appears twice.
    #[error("container path `{file}`: {reason}")]
    BadPath {
        /// The path given.
        file: String,
        /// What is wrong with it.
        reason: String,
    },
}

/// Result of this module's functions.
pub type Result<T> = std::result::Result<T, Hdf5Error>;

// ---------------------------------------------------------------------------------------------
// Thin layer over the raw library: owned ids and checked calls under the global lock.

/// An HDF5 id owned by us, released with `H5Idec_ref` (which closes any kind of object when
/// its count drops to zero) under the library lock.
struct Hid(hid_t);

impl Drop for Hid {
    fn drop(&mut self) {
        if self.0 > 0 {
            ::hdf5::sync::sync(|| unsafe {
                h5i::H5Idec_ref(self.0);
            });
        }
    }
}

/// Return codes of the library: negative means failure (`hid_t`, `herr_t`, `htri_t`, …).
trait Code: Copy {
    fn failed(self) -> bool;
}
impl Code for i32 {
    fn failed(self) -> bool {
        self < 0
    }
}
impl Code for i64 {
    fn failed(self) -> bool {
        self < 0
    }
}

/// The file an operation is about, for error messages.
#[derive(Clone, Copy)]
struct Cx<'a> {
    file: &'a str,
}

impl Cx<'_> {
    fn lib(&self, what: impl Into<String>, detail: impl Into<String>) -> Hdf5Error {
        Hdf5Error::Library {
            file: self.file.to_string(),
            what: what.into(),
            detail: detail.into(),
        }
    }

    /// Runs one library call under the lock; on failure, reads HDF5's error stack in the same
    /// critical section (the serial library's stack is global, another thread's call could
    /// overwrite it).
    fn call<T: Code>(&self, what: impl FnOnce() -> String, f: impl FnOnce() -> T) -> Result<T> {
        let r = ::hdf5::sync::sync(|| {
            let v = f();
            if v.failed() {
                Err(::hdf5::h5check(-1i32)
                    .err()
                    .map(|e| e.to_string())
                    .unwrap_or_else(|| "unknown HDF5 error".into()))
            } else {
                Ok(v)
            }
        });
        r.map_err(|detail| self.lib(what(), detail))
    }

    /// [`Cx::call`] for calls returning a new id, which the result then owns.
    fn id(&self, what: impl FnOnce() -> String, f: impl FnOnce() -> hid_t) -> Result<Hid> {
        self.call(what, f).map(Hid)
    }
}

/// Runs `f` under the library lock (for calls that cannot fail or whose failure is handled).
fn locked<T>(f: impl FnOnce() -> T) -> T {
    ::hdf5::sync::sync(f)
}

fn cstring(cx: Cx, s: &str) -> Result<CString> {
    CString::new(s).map_err(|_| cx.lib(format!("name `{s}`"), "contains a NUL byte"))
}

/// Opens `path` read-only after checking that it is readable and is HDF5.
fn open_file(cx: Cx, path: &Path, fapl: hid_t) -> Result<Hid> {
    std::fs::File::open(path).map_err(|source| Hdf5Error::Io {
        file: cx.file.to_string(),
        source,
    })?;
    let c = cstring(cx, &path.to_string_lossy())?;
    let is = locked(|| unsafe { h5f::H5Fis_hdf5(c.as_ptr()) });
    if is <= 0 {
        return Err(Hdf5Error::NotHdf5 {
            file: cx.file.to_string(),
            reason: "no HDF5 signature".into(),
        });
    }
    let f = cx
        .id(
            || "open".into(),
            || unsafe { h5f::H5Fopen(c.as_ptr(), h5f::H5F_ACC_RDONLY, fapl) },
        )
        .map_err(|e| match e {
            Hdf5Error::Library { file, detail, .. } => Hdf5Error::NotHdf5 {
                file,
                reason: detail,
            },
            e => e,
        })?;
    close_on_exec(f.0);
    Ok(f)
}

/// Marks the descriptor under an open HDF5 file close-on-exec. HDF5 opens files without
/// `O_CLOEXEC` and holds an `flock` on them (1.10 and later), so a child process started by
/// another thread meanwhile would inherit the descriptor and its lock, and every later open of
/// that file elsewhere (h5py reading a staged file) would fail with "unable to lock file" for
/// as long as the child lives. A fork between the open and this call can still leak it.
fn close_on_exec(file: hid_t) {
    let mut handle: *mut c_void = std::ptr::null_mut();
    // Files here are opened with the default (sec2) driver, whose handle is a pointer to the
    // descriptor.
    let r = locked(|| unsafe { h5f::H5Fget_vfd_handle(file, H5P_DEFAULT, &mut handle) });
    if r >= 0 && !handle.is_null() {
        unsafe {
            let fd = *(handle as *const i32);
            let flags = libc::fcntl(fd, libc::F_GETFD);
            if flags >= 0 {
                libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC);
            }
        }
    }
}

/// True when the link `path` (possibly nested, `a/b/c`) exists under `loc`, checking each
/// level so that a missing intermediate group is a "no", not a library error.
fn link_exists(cx: Cx, loc: hid_t, path: &str) -> Result<bool> {
    let mut prefix = String::new();
    for seg in path.split('/').filter(|s| !s.is_empty()) {
        if !prefix.is_empty() {
            prefix.push('/');
        }
        prefix.push_str(seg);
        let c = cstring(cx, &prefix)?;
        let r = cx.call(
            || format!("look up `{prefix}`"),
            || unsafe { h5l::H5Lexists(loc, c.as_ptr(), H5P_DEFAULT) },
        )?;
        if r == 0 {
            return Ok(false);
        }
    }
    Ok(!prefix.is_empty())
}

/// Dimensions of a dataspace; `None` for a null dataspace (no elements, no shape).
fn space_dims(cx: Cx, space: hid_t) -> Result<Option<Vec<u64>>> {
    let class = locked(|| unsafe { h5s::H5Sget_simple_extent_type(space) });
    if class == h5s::H5S_class_t::H5S_NULL {
        return Ok(None);
    }
    let rank = cx.call(
        || "dataspace rank".into(),
        || unsafe { h5s::H5Sget_simple_extent_ndims(space) },
    )?;
    let mut dims = vec![0 as hsize_t; rank as usize];
    if rank > 0 {
        cx.call(
            || "dataspace dims".into(),
            || unsafe {
                h5s::H5Sget_simple_extent_dims(space, dims.as_mut_ptr(), std::ptr::null_mut())
            },
        )?;
    }
    Ok(Some(dims))
}

fn max_dims(cx: Cx, space: hid_t, rank: usize) -> Result<Vec<u64>> {
    let mut dims = vec![0 as hsize_t; rank];
    let mut maxd = vec![0 as hsize_t; rank];
    if rank > 0 {
        cx.call(
            || "dataspace max dims".into(),
            || unsafe {
                h5s::H5Sget_simple_extent_dims(space, dims.as_mut_ptr(), maxd.as_mut_ptr())
            },
        )?;
    }
    Ok(maxd)
}

fn simple_space(cx: Cx, dims: &[u64], maxdims: Option<&[u64]>) -> Result<Hid> {
    cx.id(
        || format!("dataspace {dims:?}"),
        || unsafe {
            h5s::H5Screate_simple(
                dims.len() as i32,
                dims.as_ptr(),
                maxdims.map_or(std::ptr::null(), |m| m.as_ptr()),
            )
        },
    )
}

// ---------------------------------------------------------------------------------------------
// Datatypes.

/// What stands in the way of copying values of type `t` byte for byte into another file, and
/// whether it holds variable-length data (which needs reclaiming after each read).
fn type_traits(t: hid_t) -> (Option<&'static str>, bool) {
    locked(|| unsafe {
        if h5t::H5Tdetect_class(t, H5T_class_t::H5T_REFERENCE) > 0 {
            return (
                Some(
                    "it holds object or region references, which would point into the source file",
                ),
                false,
            );
        }
        let vlen = h5t::H5Tis_variable_str(t) > 0
            || h5t::H5Tdetect_class(t, H5T_class_t::H5T_VLEN) > 0
            || has_vlen_string(t);
        (None, vlen)
    })
}

/// Variable-length strings nested in compounds or arrays (`H5Tdetect_class` reports them as
/// strings, not as variable-length data). Called under the lock.
unsafe fn has_vlen_string(t: hid_t) -> bool {
    match h5t::H5Tget_class(t) {
        H5T_class_t::H5T_STRING => h5t::H5Tis_variable_str(t) > 0,
        H5T_class_t::H5T_COMPOUND => {
            let n = h5t::H5Tget_nmembers(t).max(0) as c_uint;
            (0..n).any(|i| {
                let m = h5t::H5Tget_member_type(t, i);
                if m < 0 {
                    return false;
                }
                let r = has_vlen_string(m);
                h5i::H5Idec_ref(m);
                r
            })
        }
        H5T_class_t::H5T_ARRAY | H5T_class_t::H5T_VLEN => {
            let b = h5t::H5Tget_super(t);
            if b < 0 {
                return false;
            }
            let r = has_vlen_string(b);
            h5i::H5Idec_ref(b);
            r
        }
        _ => false,
    }
}

/// A short numpy-like name of type `t`: `float32`, `int64`, `uint8`, `|S16`, `vlen str`, ….
fn describe_type(t: hid_t) -> String {
    locked(|| unsafe {
        let size = h5t::H5Tget_size(t);
        match h5t::H5Tget_class(t) {
            H5T_class_t::H5T_INTEGER => {
                let unsigned = h5t::H5Tget_sign(t) == H5T_sign_t::H5T_SGN_NONE;
                format!("{}int{}", if unsigned { "u" } else { "" }, size * 8)
            }
            H5T_class_t::H5T_FLOAT => format!("float{}", size * 8),
            H5T_class_t::H5T_STRING if h5t::H5Tis_variable_str(t) > 0 => "vlen str".into(),
            H5T_class_t::H5T_STRING => format!("|S{size}"),
            H5T_class_t::H5T_COMPOUND => format!("compound({size} bytes)"),
            H5T_class_t::H5T_ENUM => format!("enum({size} bytes)"),
            H5T_class_t::H5T_ARRAY => format!("array({size} bytes)"),
            H5T_class_t::H5T_VLEN => "vlen".into(),
            H5T_class_t::H5T_OPAQUE => format!("opaque({size} bytes)"),
            H5T_class_t::H5T_BITFIELD => format!("bitfield({size} bytes)"),
            H5T_class_t::H5T_REFERENCE => "reference".into(),
            _ => format!("other({size} bytes)"),
        }
    })
}

/// Reads `n` values of file type `t` through `read(mem_type, buf)` and renders each as a label:
/// integers and floats in decimal, strings as text, enum values (h5py booleans included) by
/// member name. `Err(reason)` for other types.
fn values_to_labels(
    cx: Cx,
    t: hid_t,
    n: usize,
    read: &mut dyn FnMut(hid_t, *mut c_void) -> Result<()>,
) -> Result<std::result::Result<Vec<String>, String>> {
    let (class, size, sign) = locked(|| unsafe {
        (
            h5t::H5Tget_class(t),
            h5t::H5Tget_size(t),
            h5t::H5Tget_sign(t),
        )
    });
    let native = |f: fn() -> hid_t| locked(f);
    Ok(Ok(match class {
        H5T_class_t::H5T_INTEGER if sign == H5T_sign_t::H5T_SGN_NONE => {
            let mut v = vec![0u64; n];
            read(native(|| *h5t::H5T_NATIVE_UINT64), v.as_mut_ptr().cast())?;
            v.iter().map(|x| x.to_string()).collect()
        }
        H5T_class_t::H5T_INTEGER => {
            let mut v = vec![0i64; n];
            read(native(|| *h5t::H5T_NATIVE_INT64), v.as_mut_ptr().cast())?;
            v.iter().map(|x| x.to_string()).collect()
        }
        // A float32 label read as f64 would print as 0.10000000149011612.
        H5T_class_t::H5T_FLOAT if size <= 4 => {
            let mut v = vec![0f32; n];
            read(native(|| *h5t::H5T_NATIVE_FLOAT), v.as_mut_ptr().cast())?;
            v.iter().map(|x| x.to_string()).collect()
        }
        H5T_class_t::H5T_FLOAT => {
            let mut v = vec![0f64; n];
            read(native(|| *h5t::H5T_NATIVE_DOUBLE), v.as_mut_ptr().cast())?;
            v.iter().map(|x| x.to_string()).collect()
        }
        H5T_class_t::H5T_STRING => {
            let mem = cx.id(|| "copy string type".into(), || unsafe { h5t::H5Tcopy(t) })?;
            if locked(|| unsafe { h5t::H5Tis_variable_str(t) }) > 0 {
                let mut v: Vec<*mut c_char> = vec![std::ptr::null_mut(); n];
                read(mem.0, v.as_mut_ptr().cast())?;
                let out = v
                    .iter()
                    .map(|&p| {
                        if p.is_null() {
                            String::new()
                        } else {
                            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
                        }
                    })
                    .collect();
                let space = simple_space(cx, &[n as u64], None)?;
                locked(|| unsafe {
                    #[allow(deprecated)]
                    h5d::H5Dvlen_reclaim(mem.0, space.0, H5P_DEFAULT, v.as_mut_ptr().cast());
                });
                out
            } else {
                let pad = locked(|| unsafe { h5t::H5Tget_strpad(t) });
                let mut v = vec![0u8; n * size];
                read(mem.0, v.as_mut_ptr().cast())?;
                v.chunks(size.max(1))
                    .map(|s| {
                        let s = match pad {
                            H5T_str_t::H5T_STR_SPACEPAD => {
                                let end = s.iter().rposition(|&b| b != b' ').map_or(0, |i| i + 1);
                                &s[..end]
                            }
                            _ => &s[..s.iter().position(|&b| b == 0).unwrap_or(s.len())],
                        };
                        String::from_utf8_lossy(s).into_owned()
                    })
                    .collect()
            }
        }
        H5T_class_t::H5T_ENUM => {
            let mem = cx.id(|| "copy enum type".into(), || unsafe { h5t::H5Tcopy(t) })?;
            let mut v = vec![0u8; n * size];
            read(mem.0, v.as_mut_ptr().cast())?;
            let mut out = Vec::with_capacity(n);
            for val in v.chunks(size.max(1)) {
                let mut name = [0 as c_char; 256];
                cx.call(
                    || "enum value name".into(),
                    || unsafe {
                        h5t::H5Tenum_nameof(t, val.as_ptr().cast(), name.as_mut_ptr(), name.len())
                    },
                )?;
                out.push(
                    unsafe { CStr::from_ptr(name.as_ptr()) }
                        .to_string_lossy()
                        .into_owned(),
                );
            }
            out
        }
        _ => {
            return Ok(Err(format!(
                "type {} makes no label (integers, floats, strings and enums do)",
                describe_type(t)
            )))
        }
    }))
}

// ---------------------------------------------------------------------------------------------
// Per-sample labels.

/// Reads a class label from each per-sample HDF5 file `root/<path>`: the scalar dataset `name`
/// (a path such as `label` or `meta/label`), or, when the file has no such dataset, the
/// attribute `name` of the root group. Integers and floats become their decimal text, strings
/// their text, enum values (h5py booleans included) their member name. A one-element array
/// counts as a scalar.
///
/// Fails on the first file that is not HDF5, lacks `name`, or holds no scalar there, naming
/// the file. Opens every file: call it once when the catalog is built (the catalog saves the
/// labels), from a blocking thread.
pub fn read_scalar_labels(
    root: &Path,
    paths: impl Iterator<Item = String>,
    name: &str,
) -> Result<Vec<String>> {
    let mut out = Vec::with_capacity(paths.size_hint().0);
    for rel in paths {
        out.push(read_scalar_label(&root.join(&rel), &rel, name)?);
    }
    Ok(out)
}

fn read_scalar_label(path: &Path, rel: &str, name: &str) -> Result<String> {
    let cx = Cx { file: rel };
    let bad = |reason: String| Hdf5Error::Label {
        file: rel.to_string(),
        name: name.to_string(),
        reason,
    };
    let file = open_file(cx, path, H5P_DEFAULT)?;
    let cname = cstring(cx, name)?;
    let trimmed = name.trim_matches('/');
    let is_dataset = !trimmed.is_empty()
        && link_exists(cx, file.0, trimmed)?
        && locked(|| unsafe { h5o::H5Oexists_by_name(file.0, cname.as_ptr(), H5P_DEFAULT) }) > 0
        && {
            let obj = cx.id(
                || format!("open `{name}`"),
                || unsafe { h5o::H5Oopen(file.0, cname.as_ptr(), H5P_DEFAULT) },
            )?;
            locked(|| unsafe { h5i::H5Iget_type(obj.0) }) == h5i::H5I_type_t::H5I_DATASET
        };
    let (obj, space, t, is_attr) = if is_dataset {
        let d = cx.id(
            || format!("open dataset `{name}`"),
            || unsafe { h5d::H5Dopen2(file.0, cname.as_ptr(), H5P_DEFAULT) },
        )?;
        let s = cx.id(|| "dataspace".into(), || unsafe { h5d::H5Dget_space(d.0) })?;
        let t = cx.id(|| "datatype".into(), || unsafe { h5d::H5Dget_type(d.0) })?;
        (d, s, t, false)
    } else {
        let exists = cx.call(
            || format!("look up attribute `{name}`"),
            || unsafe { h5a::H5Aexists(file.0, cname.as_ptr()) },
        )?;
        if exists == 0 {
            return Err(bad(
                "no such dataset, nor attribute of the root group".to_string()
            ));
        }
        let a = cx.id(
            || format!("open attribute `{name}`"),
            || unsafe { h5a::H5Aopen(file.0, cname.as_ptr(), H5P_DEFAULT) },
        )?;
        let s = cx.id(|| "dataspace".into(), || unsafe { h5a::H5Aget_space(a.0) })?;
        let t = cx.id(|| "datatype".into(), || unsafe { h5a::H5Aget_type(a.0) })?;
        (a, s, t, true)
    };
    let kind = if is_attr { "attribute" } else { "dataset" };
    match space_dims(cx, space.0)? {
        None => return Err(bad(format!("the {kind} is empty (null dataspace)"))),
        Some(d) if d.iter().product::<u64>() != 1 => {
            return Err(bad(format!("the {kind} is not a scalar (shape {d:?})")))
        }
        Some(_) => {}
    }
    let mut read = |mem: hid_t, buf: *mut c_void| -> Result<()> {
        cx.call(
            || format!("read `{name}`"),
            || unsafe {
                if is_attr {
                    h5a::H5Aread(obj.0, mem, buf)
                } else {
                    h5d::H5Dread(obj.0, mem, H5S_ALL, H5S_ALL, H5P_DEFAULT, buf)
                }
            },
        )
        .map(|_| ())
    };
    match values_to_labels(cx, t.0, 1, &mut read)? {
        Ok(mut v) => Ok(v.pop().unwrap_or_default()),
        Err(reason) => Err(bad(reason)),
    }
}

// ---------------------------------------------------------------------------------------------
// Container inspection.

/// One row dataset of a container file, as inspected by [`open_containers`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DatasetInfo {
    /// Path inside the file, without a leading `/` (`images`, `group/x`).
    pub name: String,
    /// numpy-like type name (`float32`, `int64`, `|S16`, `vlen str`, `compound(24 bytes)`).
    pub dtype: String,
    /// Bytes of one element in the file's type (for variable-length types, of its handle).
    pub elem_size: u64,
    /// Shape after axis 0.
    pub trailing: Vec<u64>,
    /// Chunk shape, when the dataset is chunked.
    pub chunk: Option<Vec<u64>>,
    /// Filters of the source, in pipeline order (`shuffle`, `gzip(4)`, …).
    pub filters: Vec<String>,
    /// Source filters the library cannot encode, so staged copies go without them.
    pub dropped_filters: Vec<String>,
    /// Names of the dataset's attributes.
    pub attrs: Vec<String>,
    /// Bytes of one row (estimated from sampled rows for variable-length types).
    pub row_bytes: u64,
    /// True when the type holds variable-length data.
    pub vlen: bool,
}

/// One container file, as inspected by [`open_containers`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerFile {
    /// Path relative to the source root; also the catalog directory of its rows.
    pub path: String,
    /// Number of rows `N`.
    pub rows: u64,
    /// The row datasets, in file order (by name within each group, groups depth first).
    pub datasets: Vec<DatasetInfo>,
    /// Bytes of one row across the row datasets (what a sample weighs, less `metfs_index`).
    pub row_bytes: u64,
    /// Groups recreated in staged files (parents before children).
    pub groups: Vec<String>,
    /// Datasets copied whole into each staged file, and their total bytes.
    pub side: Vec<String>,
    /// Bytes of the side datasets (storage size in the source), per staged file.
    pub side_bytes: u64,
    /// Objects that staged files do not hold, each with why.
    pub left_out: Vec<String>,
    /// Digits of the row part of sample names.
    width: usize,
    /// Class id of each row (into [`Containers::label_names`]) when there is a label dataset.
    labels: Option<Vec<u32>>,
    /// Size and modification time when inspected, to notice a source that changes.
    len: u64,
    mtime_ns: i128,
}

/// Container files of a dataset, inspected and validated. Plain data (no open HDF5 handles):
/// share it between threads freely.
#[derive(Debug, Clone)]
pub struct Containers {
    root: PathBuf,
    files: Vec<ContainerFile>,
    /// `first[i]` is the sample id of row 0 of file `i`; `first[files.len()]` is the total.
    first: Vec<u64>,
    label_names: Vec<String>,
}

fn mtime_ns(md: &std::fs::Metadata) -> i128 {
    md.modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_nanos() as i128)
}

fn digits(n: u64) -> usize {
    n.checked_ilog10().map_or(1, |d| d as usize + 1)
}

/// Inspects the container files `files` (paths relative to `root`, a POSIX source) and checks
/// that they can be staged; see the module docs for how row datasets are chosen. `datasets`
/// names the row datasets (the same in every file); `label_dataset` names a 1-D dataset of
/// length `N` holding each row's class label.
///
/// Every bad input is reported here, before anything is staged, naming the file and dataset:
/// not an HDF5 file, a named dataset missing, datasets of different first dimensions, a dataset
/// that cannot be copied, a label dataset missing or not 1-D of length `N`.
pub fn open_containers(
    root: &Path,
    files: &[String],
    datasets: Option<&[String]>,
    label_dataset: Option<&str>,
) -> Result<Containers> {
    let mut sorted: Vec<&String> = files.iter().collect();
    // Catalog order of `<path>/<row>` names is the order of `<path>/`.
    sorted.sort_by(|a, b| {
        a.bytes()
            .chain(std::iter::once(b'/'))
            .cmp(b.bytes().chain(std::iter::once(b'/')))
    });
    for w in sorted.windows(2) {
        if w[0] == w[1] {
            return Err(Hdf5Error::BadPath {
                file: w[0].clone(),
                reason: "listed twice".into(),
            });
        }
    }
    let names: Option<Vec<String>> =
        datasets.map(|d| d.iter().map(|s| s.trim_matches('/').to_string()).collect());
    let label = label_dataset.map(|s| s.trim_matches('/').to_string());
    let mut label_ids = std::collections::HashMap::new();
    let mut label_names = Vec::new();
    let mut out = Vec::with_capacity(sorted.len());
    let mut first = vec![0u64];
    for rel in sorted {
        crate::catalog::validate_rel_path(rel).map_err(|reason| Hdf5Error::BadPath {
            file: rel.clone(),
            reason: reason.into(),
        })?;
        let cf = inspect(
            root,
            rel,
            names.as_deref(),
            label.as_deref(),
            &mut label_ids,
            &mut label_names,
        )?;
        first.push(first.last().unwrap() + cf.rows);
        out.push(cf);
    }
    if *first.last().unwrap() > u32::MAX as u64 {
        return Err(Hdf5Error::BadRows {
            file: root.display().to_string(),
            reason: format!(
                "{} rows in all is more than a catalog can hold",
                first.last().unwrap()
            ),
        });
    }
    Ok(Containers {
        root: root.to_path_buf(),
        files: out,
        first,
        label_names,
    })
}

/// Objects of one file found by walking its groups.
#[derive(Default)]
struct Tree {
    groups: Vec<String>,
    datasets: Vec<String>,
    skipped: Vec<String>,
}

fn walk(
    g: &::hdf5::Group,
    prefix: &str,
    tree: &mut Tree,
    seen: &mut Vec<::hdf5::LocationToken>,
) -> ::hdf5::Result<()> {
    let mut links = Vec::new();
    g.iter_visit_default(|name, info| {
        links.push((name.to_string(), info.link_type));
        Ok(())
    })?;
    for (name, kind) in links {
        let path = if prefix.is_empty() {
            name.clone()
        } else {
            format!("{prefix}/{name}")
        };
        if kind != ::hdf5::LinkType::Hard {
            tree.skipped.push(format!("{path} (soft or external link)"));
            continue;
        }
        let info = g.loc_info_by_name(&name)?;
        // A second hard link to an object already seen (or to an ancestor: a cycle).
        if seen.contains(&info.token) {
            tree.skipped
                .push(format!("{path} (another link to an object seen)"));
            continue;
        }
        seen.push(info.token);
        match info.loc_type {
            ::hdf5::LocationType::Group => {
                tree.groups.push(path.clone());
                walk(&g.group(&name)?, &path, tree, seen)?;
            }
            ::hdf5::LocationType::Dataset => tree.datasets.push(path),
            _ => tree.skipped.push(format!("{path} (committed datatype)")),
        }
    }
    Ok(())
}

/// What [`inspect`] learns of one dataset before choosing.
struct Probe {
    name: String,
    dims: Option<Vec<u64>>,
}

fn open_dataset(cx: Cx, file: hid_t, name: &str, dapl: hid_t) -> Result<Hid> {
    let c = cstring(cx, name)?;
    cx.id(
        || format!("open dataset `{name}`"),
        || unsafe { h5d::H5Dopen2(file, c.as_ptr(), dapl) },
    )
}

fn attr_names(cx: Cx, obj: hid_t) -> Result<Vec<String>> {
    #[allow(deprecated)]
    let n = cx.call(
        || "count attributes".into(),
        || unsafe { h5a::H5Aget_num_attrs(obj) },
    )?;
    let mut out = Vec::with_capacity(n as usize);
    for i in 0..n as u64 {
        let a = open_attr_by_idx(cx, obj, i)?;
        let mut buf = vec![0 as c_char; 1024];
        let len = locked(|| unsafe { h5a::H5Aget_name(a.0, buf.len(), buf.as_mut_ptr()) });
        if len < 0 {
            return Err(cx.lib("attribute name", "failed"));
        }
        if len as usize >= buf.len() {
            buf = vec![0 as c_char; len as usize + 1];
            locked(|| unsafe { h5a::H5Aget_name(a.0, buf.len(), buf.as_mut_ptr()) });
        }
        out.push(
            unsafe { CStr::from_ptr(buf.as_ptr()) }
                .to_string_lossy()
                .into_owned(),
        );
    }
    Ok(out)
}

/// Attribute `i` of `obj`, in creation order when the object tracks it, else in name order
/// (h5py's default listing order), so that copies list their attributes as the source does.
fn open_attr_by_idx(cx: Cx, obj: hid_t, i: u64) -> Result<Hid> {
    let dot = c".";
    let crt = locked(|| unsafe {
        h5a::H5Aopen_by_idx(
            obj,
            dot.as_ptr(),
            H5_index_t::H5_INDEX_CRT_ORDER,
            H5_iter_order_t::H5_ITER_INC,
            i,
            H5P_DEFAULT,
            H5P_DEFAULT,
        )
    });
    if crt >= 0 {
        return Ok(Hid(crt));
    }
    cx.id(
        || format!("open attribute #{i}"),
        || unsafe {
            h5a::H5Aopen_by_idx(
                obj,
                dot.as_ptr(),
                H5_index_t::H5_INDEX_NAME,
                H5_iter_order_t::H5_ITER_INC,
                i,
                H5P_DEFAULT,
                H5P_DEFAULT,
            )
        },
    )
}

/// Filters of a dataset creation property list: (id, description, decodable, encodable).
fn filters(cx: Cx, dcpl: hid_t) -> Result<Vec<(i32, String, bool, bool)>> {
    let n = cx.call(
        || "count filters".into(),
        || unsafe { h5p::H5Pget_nfilters(dcpl) },
    )?;
    let mut out = Vec::new();
    for i in 0..n as c_uint {
        let mut flags: c_uint = 0;
        let mut nelmts: usize = 16;
        let mut cd = [0 as c_uint; 16];
        let mut name = [0 as c_char; 256];
        let mut config: c_uint = 0;
        let id = cx.call(
            || format!("filter #{i}"),
            || unsafe {
                h5p::H5Pget_filter2(
                    dcpl,
                    i,
                    &mut flags,
                    &mut nelmts,
                    cd.as_mut_ptr(),
                    name.len(),
                    name.as_mut_ptr(),
                    &mut config,
                )
            },
        )?;
        let desc = match id {
            h5z::H5Z_FILTER_DEFLATE => format!("gzip({})", cd[0]),
            h5z::H5Z_FILTER_SHUFFLE => "shuffle".into(),
            h5z::H5Z_FILTER_FLETCHER32 => "fletcher32".into(),
            h5z::H5Z_FILTER_SZIP => "szip".into(),
            h5z::H5Z_FILTER_NBIT => "nbit".into(),
            h5z::H5Z_FILTER_SCALEOFFSET => "scaleoffset".into(),
            _ => {
                let n = unsafe { CStr::from_ptr(name.as_ptr()) }.to_string_lossy();
                format!("filter {id} ({n})")
            }
        };
        let avail = locked(|| unsafe { h5z::H5Zfilter_avail(id) }) > 0;
        let mut cfg: c_uint = 0;
        let info = avail && locked(|| unsafe { h5z::H5Zget_filter_info(id, &mut cfg) }) >= 0;
        let dec = info && cfg & h5z::H5Z_FILTER_CONFIG_DECODE_ENABLED != 0;
        let enc = info && cfg & h5z::H5Z_FILTER_CONFIG_ENCODE_ENABLED != 0;
        out.push((id, desc, dec, enc));
    }
    Ok(out)
}

fn inspect(
    root: &Path,
    rel: &str,
    names: Option<&[String]>,
    label: Option<&str>,
    label_ids: &mut std::collections::HashMap<String, u32>,
    label_names: &mut Vec<String>,
) -> Result<ContainerFile> {
    let cx = Cx { file: rel };
    let path = root.join(rel);
    let md = std::fs::metadata(&path).map_err(|source| Hdf5Error::Io {
        file: rel.to_string(),
        source,
    })?;
    let file = open_file(cx, &path, H5P_DEFAULT)?;
    // The hdf5 crate walks groups portably across library versions; it gets its own reference
    // to the open file.
    locked(|| unsafe { h5i::H5Iinc_ref(file.0) });
    // Safety: `file.0` is a valid file id whose extra reference the `File` now owns.
    let hfile: ::hdf5::File =
        unsafe { ::hdf5::from_id(file.0) }.map_err(|e| cx.lib("open", e.to_string()))?;
    let mut tree = Tree::default();
    let mut seen = Vec::new();
    if let Ok(info) = hfile.loc_info() {
        seen.push(info.token);
    }
    walk(&hfile, "", &mut tree, &mut seen).map_err(|e| cx.lib("list objects", e.to_string()))?;
    drop(hfile);
    if tree.datasets.iter().any(|d| d == INDEX_DATASET) {
        return Err(Hdf5Error::Unsupported {
            file: rel.to_string(),
            dataset: INDEX_DATASET.into(),
            reason: "the name is reserved for the row index staged files get".into(),
        });
    }

    let probe = |name: &str| -> Result<Probe> {
        let d = open_dataset(cx, file.0, name, H5P_DEFAULT)?;
        let s = cx.id(|| "dataspace".into(), || unsafe { h5d::H5Dget_space(d.0) })?;
        Ok(Probe {
            name: name.to_string(),
            dims: space_dims(cx, s.0)?,
        })
    };
    let probes: Vec<Probe> = tree
        .datasets
        .iter()
        .map(|n| probe(n))
        .collect::<Result<_>>()?;
    let first_dim = |p: &Probe| p.dims.as_ref().and_then(|d| d.first().copied());

    // The label dataset, when given, fixes N.
    let label_n = match label {
        None => None,
        Some(l) => {
            let bad = |reason: String| Hdf5Error::LabelDataset {
                file: rel.to_string(),
                dataset: l.to_string(),
                reason,
            };
            let p = probes
                .iter()
                .find(|p| p.name == l)
                .ok_or_else(|| bad("not found".into()))?;
            match &p.dims {
                Some(d) if d.len() == 1 => Some(d[0]),
                Some(d) => return Err(bad(format!("not 1-D (shape {d:?})"))),
                None => return Err(bad("empty (null dataspace)".into())),
            }
        }
    };

    let (chosen, n): (Vec<String>, u64) = match names {
        Some(names) => {
            if names.is_empty() {
                return Err(Hdf5Error::NoDatasets {
                    file: rel.to_string(),
                    reason: "the list of datasets is empty".into(),
                });
            }
            let mut dims = Vec::new();
            for name in names {
                let missing = |reason: &str| Hdf5Error::MissingDataset {
                    file: rel.to_string(),
                    dataset: name.clone(),
                    reason: reason.to_string(),
                };
                let Some(p) = probes.iter().find(|p| &p.name == name) else {
                    let what = if tree.groups.contains(name) {
                        "is a group, not a dataset"
                    } else {
                        "not found"
                    };
                    return Err(missing(what));
                };
                match first_dim(p) {
                    Some(d) => dims.push((name.clone(), d)),
                    None => return Err(missing("is a scalar or empty: it has no rows")),
                }
            }
            let n = dims[0].1;
            if dims.iter().any(|(_, d)| *d != n) {
                let s: Vec<String> = dims.iter().map(|(k, d)| format!("{k}: {d}")).collect();
                return Err(Hdf5Error::FirstDimMismatch {
                    file: rel.to_string(),
                    dims: s.join(", "),
                });
            }
            if let (Some(l), Some(ln)) = (label, label_n) {
                if ln != n {
                    return Err(Hdf5Error::LabelDataset {
                        file: rel.to_string(),
                        dataset: l.to_string(),
                        reason: format!("has {ln} entries, but the row datasets have {n} rows"),
                    });
                }
            }
            (names.to_vec(), n)
        }
        None => {
            let n = match label_n {
                Some(n) => n,
                None => {
                    let mut counts: Vec<(u64, usize)> = Vec::new();
                    for d in probes.iter().filter_map(first_dim) {
                        match counts.iter_mut().find(|(k, _)| *k == d) {
                            Some((_, c)) => *c += 1,
                            None => counts.push((d, 1)),
                        }
                    }
                    counts
                        .iter()
                        .max_by_key(|(d, c)| (*c, *d))
                        .map(|(d, _)| *d)
                        .ok_or_else(|| Hdf5Error::NoDatasets {
                            file: rel.to_string(),
                            reason: "no dataset has rank 1 or more".into(),
                        })?
                }
            };
            let chosen: Vec<String> = probes
                .iter()
                .filter(|p| first_dim(p) == Some(n))
                .map(|p| p.name.clone())
                .collect();
            (chosen, n)
        }
    };

    let mut infos = Vec::with_capacity(chosen.len());
    for name in &chosen {
        infos.push(dataset_info(cx, file.0, name, n)?);
    }
    let row_bytes = infos.iter().map(|d| d.row_bytes).sum();

    // Side datasets and what is left out.
    let mut side = Vec::new();
    let mut side_bytes = 0;
    let mut left_out = tree.skipped;
    for p in &probes {
        if chosen.contains(&p.name) {
            continue;
        }
        if first_dim(p) == Some(n) {
            left_out.push(format!("{} (has {n} rows but was not named)", p.name));
            continue;
        }
        let d = open_dataset(cx, file.0, &p.name, H5P_DEFAULT)?;
        let t = cx.id(|| "datatype".into(), || unsafe { h5d::H5Dget_type(d.0) })?;
        let bytes = locked(|| unsafe { h5d::H5Dget_storage_size(d.0) });
        if let (Some(why), _) = type_traits(t.0) {
            left_out.push(format!("{} ({why})", p.name));
        } else if bytes > SIDE_LIMIT {
            left_out.push(format!(
                "{} ({bytes} bytes, more than the {SIDE_LIMIT} copied into every staged file)",
                p.name
            ));
        } else {
            side.push(p.name.clone());
            side_bytes += bytes;
        }
    }

    let labels = match label {
        None => None,
        Some(l) => Some(read_label_dataset(
            cx,
            file.0,
            l,
            n,
            label_ids,
            label_names,
        )?),
    };

    Ok(ContainerFile {
        path: rel.to_string(),
        rows: n,
        datasets: infos,
        row_bytes,
        groups: tree.groups,
        side,
        side_bytes,
        left_out,
        width: digits(n.saturating_sub(1)),
        labels,
        len: md.len(),
        mtime_ns: mtime_ns(&md),
    })
}

/// Inspects one row dataset (`n` rows) and checks it can be staged.
fn dataset_info(cx: Cx, file: hid_t, name: &str, n: u64) -> Result<DatasetInfo> {
    let unsupported = |reason: String| Hdf5Error::Unsupported {
        file: cx.file.to_string(),
        dataset: name.to_string(),
        reason,
    };
    let d = open_dataset(cx, file, name, H5P_DEFAULT)?;
    let s = cx.id(|| "dataspace".into(), || unsafe { h5d::H5Dget_space(d.0) })?;
    let t = cx.id(|| "datatype".into(), || unsafe { h5d::H5Dget_type(d.0) })?;
    let dcpl = cx.id(
        || "creation properties".into(),
        || unsafe { h5d::H5Dget_create_plist(d.0) },
    )?;
    let dims = space_dims(cx, s.0)?.unwrap_or_default();
    let (problem, vlen) = type_traits(t.0);
    if let Some(p) = problem {
        return Err(unsupported(p.to_string()));
    }
    let elem_size = locked(|| unsafe { h5t::H5Tget_size(t.0) }) as u64;
    let layout = locked(|| unsafe { h5p::H5Pget_layout(dcpl.0) });
    let chunk = if layout == H5D_layout_t::H5D_CHUNKED {
        let mut c = vec![0 as hsize_t; dims.len()];
        cx.call(
            || "chunk shape".into(),
            || unsafe { h5p::H5Pget_chunk(dcpl.0, c.len() as i32, c.as_mut_ptr()) },
        )?;
        Some(c)
    } else {
        None
    };
    let mut fl = Vec::new();
    let mut dropped = Vec::new();
    for (id, desc, dec, enc) in filters(cx, dcpl.0)? {
        if !dec {
            return Err(unsupported(format!(
                "it is compressed with {desc}, which this HDF5 library cannot decode \
                 (filter id {id}; h5py's lzf and Blosc need plugins)"
            )));
        }
        if !enc {
            dropped.push(desc.clone());
        }
        fl.push(desc);
    }
    let trailing = dims[1..].to_vec();
    let elems: u64 = trailing.iter().product();
    let row_bytes = if vlen && n > 0 {
        // The handles plus the payload of a sample of rows, averaged.
        let sample = n.min(VLEN_SAMPLE_ROWS);
        let mut start = vec![0 as hsize_t; dims.len()];
        let mut count = dims.clone();
        count[0] = sample;
        start[0] = 0;
        cx.call(
            || "select rows".into(),
            || unsafe {
                h5s::H5Sselect_hyperslab(
                    s.0,
                    H5S_seloper_t::H5S_SELECT_SET,
                    start.as_ptr(),
                    std::ptr::null(),
                    count.as_ptr(),
                    std::ptr::null(),
                )
            },
        )?;
        let mut payload: hsize_t = 0;
        cx.call(
            || format!("size of variable-length data in `{name}`"),
            || unsafe { h5d::H5Dvlen_get_buf_size(d.0, t.0, s.0, &mut payload) },
        )?;
        elems * elem_size + payload.div_ceil(sample)
    } else {
        elems * elem_size
    };
    Ok(DatasetInfo {
        name: name.to_string(),
        dtype: describe_type(t.0),
        elem_size,
        trailing,
        chunk,
        filters: fl,
        dropped_filters: dropped,
        attrs: attr_names(cx, d.0)?,
        row_bytes,
        vlen,
    })
}

/// Reads the 1-D label dataset `name` (length `n`) in blocks, interning labels as it goes so
/// that ten million rows cost four bytes each.
fn read_label_dataset(
    cx: Cx,
    file: hid_t,
    name: &str,
    n: u64,
    ids: &mut std::collections::HashMap<String, u32>,
    names: &mut Vec<String>,
) -> Result<Vec<u32>> {
    const STEP: u64 = 1 << 20;
    let d = open_dataset(cx, file, name, H5P_DEFAULT)?;
    let t = cx.id(|| "datatype".into(), || unsafe { h5d::H5Dget_type(d.0) })?;
    let fspace = cx.id(|| "dataspace".into(), || unsafe { h5d::H5Dget_space(d.0) })?;
    let mut out = Vec::with_capacity(n as usize);
    let mut start = 0;
    while start < n {
        let len = STEP.min(n - start);
        let mspace = simple_space(cx, &[len], None)?;
        cx.call(
            || "select labels".into(),
            || unsafe {
                h5s::H5Sselect_hyperslab(
                    fspace.0,
                    H5S_seloper_t::H5S_SELECT_SET,
                    [start].as_ptr(),
                    std::ptr::null(),
                    [len].as_ptr(),
                    std::ptr::null(),
                )
            },
        )?;
        let mut read = |mem: hid_t, buf: *mut c_void| -> Result<()> {
            cx.call(
                || format!("read labels `{name}`"),
                || unsafe { h5d::H5Dread(d.0, mem, mspace.0, fspace.0, H5P_DEFAULT, buf) },
            )
            .map(|_| ())
        };
        let labels = values_to_labels(cx, t.0, len as usize, &mut read)?.map_err(|reason| {
            Hdf5Error::LabelDataset {
                file: cx.file.to_string(),
                dataset: name.to_string(),
                reason,
            }
        })?;
        for l in labels {
            let id = match ids.get(&l) {
                Some(&id) => id,
                None => {
                    let id = names.len() as u32;
                    ids.insert(l.clone(), id);
                    names.push(l);
                    id
                }
            };
            out.push(id);
        }
        start += len;
    }
    Ok(out)
}

impl Containers {
    /// The source root the container paths are relative to.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Total rows over all files: the number of samples.
    pub fn samples(&self) -> usize {
        *self.first.last().unwrap() as usize
    }

    /// The files, in sample-id order (see the module docs).
    pub fn files(&self) -> &[ContainerFile] {
        &self.files
    }

    /// Index of the file with relative path `path`.
    pub fn file_index(&self, path: &str) -> Option<usize> {
        self.files.iter().position(|f| f.path == path)
    }

    /// Names of the labels, indexed by the class ids the files' rows carry, when there is a
    /// label dataset.
    pub fn label_names(&self) -> &[String] {
        &self.label_names
    }

    /// Label of row `row` of file `file`, when there is a label dataset.
    pub fn label(&self, file: usize, row: u64) -> Option<&str> {
        let l = self.files[file].labels.as_ref()?;
        Some(&self.label_names[l[row as usize] as usize])
    }

    /// Catalog size of one sample of file `file`: its row bytes plus 8 for `metfs_index`.
    pub fn sample_size(&self, file: usize) -> u64 {
        self.files[file].row_bytes + 8
    }

    /// Sample id of row `row` of file `file`.
    pub fn sample_id(&self, file: usize, row: u64) -> u32 {
        debug_assert!(row < self.files[file].rows);
        (self.first[file] + row) as u32
    }

    /// File index and row of sample `sample` (binary search over the files: O(log files)).
    pub fn locate(&self, sample: u32) -> (usize, u64) {
        let s = sample as u64;
        let f = self.first.partition_point(|&x| x <= s) - 1;
        (f, s - self.first[f])
    }

    /// Catalog path of sample `sample`: `<file>/<row>`, the row zero-padded.
    pub fn sample_path(&self, sample: u32) -> String {
        let (f, row) = self.locate(sample);
        let cf = &self.files[f];
        format!("{}/{:0w$}", cf.path, row, w = cf.width)
    }

    /// Groups a mini-epoch's sample ids by file: `(file index, ascending rows)` for every file
    /// with at least one row in it, in file order. This is what [`stage_rows`] takes.
    pub fn rows_by_file(&self, samples: &[u32]) -> Vec<(usize, Vec<u64>)> {
        let mut per: Vec<Vec<u64>> = vec![Vec::new(); self.files.len()];
        for &s in samples {
            let (f, r) = self.locate(s);
            per[f].push(r);
        }
        per.into_iter()
            .enumerate()
            .filter(|(_, r)| !r.is_empty())
            .map(|(f, mut r)| {
                r.sort_unstable();
                r.dedup();
                (f, r)
            })
            .collect()
    }

    /// Builds the catalog: one sample per row, named `<file>/<row>`, sized
    /// [`Containers::sample_size`], labelled from the label dataset when there is one, with an
    /// empty version (a container's identity is checked per file by [`stage_rows`]). Sample
    /// ids equal [`Containers::sample_id`]. `origin` names the source in errors.
    pub fn catalog(&self, origin: &str) -> Result<Catalog> {
        let mut b = CatalogBuilder::with_capacity(self.samples());
        let mut path = String::new();
        for (fi, cf) in self.files.iter().enumerate() {
            let size = self.sample_size(fi);
            for row in 0..cf.rows {
                use std::fmt::Write;
                path.clear();
                let _ = write!(path, "{}/{:0w$}", cf.path, row, w = cf.width);
                let label = cf
                    .labels
                    .as_ref()
                    .map(|l| self.label_names[l[row as usize] as usize].as_str());
                b.push(&path, size, "", label, None)
                    .map_err(|e| catalog_err(origin, e))?;
            }
        }
        let cat = b.finish(origin).map_err(|e| catalog_err(origin, e))?;
        // The arithmetic of `sample_id` holds only if the catalog kept the files' order.
        for (fi, cf) in self.files.iter().enumerate() {
            if cf.rows > 0
                && cat.path(self.first[fi] as u32) != self.sample_path(self.first[fi] as u32)
            {
                return Err(Hdf5Error::BadPath {
                    file: cf.path.clone(),
                    reason: format!("{origin}: catalog order differs from container order"),
                });
            }
        }
        Ok(cat)
    }

    /// Checks that file `file` still has the size and modification time it had when inspected.
    pub fn check_unchanged(&self, file: usize) -> Result<()> {
        let cf = &self.files[file];
        let md = std::fs::metadata(self.root.join(&cf.path)).map_err(|source| Hdf5Error::Io {
            file: cf.path.clone(),
            source,
        })?;
        if md.len() != cf.len || mtime_ns(&md) != cf.mtime_ns {
            return Err(Hdf5Error::SourceChanged {
                file: cf.path.clone(),
                reason: format!(
                    "size {} -> {}, mtime {} -> {}",
                    cf.len,
                    md.len(),
                    cf.mtime_ns,
                    mtime_ns(&md)
                ),
            });
        }
        Ok(())
    }
}

fn catalog_err(origin: &str, e: BuildError) -> Hdf5Error {
    Hdf5Error::BadPath {
        file: origin.to_string(),
        reason: format!("{e:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Staging.

/// Writes a new HDF5 file at `out` holding rows `rows` (strictly ascending, each below the
/// file's row count) of container `file` of `c`; see the module docs for its layout. Moves
/// each block of rows only after `pacer` admits its bytes. Returns the size of the written
/// file.
///
/// Writes `out` only (created or truncated; removed again on error) and does not fsync it: the
/// caller verifies, fsyncs and renames it into the slot. Fails with
/// [`Hdf5Error::SourceChanged`] when the container differs from what [`open_containers`] saw,
/// before or after copying. Blocks: run it on a blocking thread.
pub fn stage_rows(
    c: &Containers,
    file: usize,
    rows: &[u64],
    out: &Path,
    pacer: &Pacer,
) -> Result<u64> {
    let cf = c.files.get(file).ok_or_else(|| Hdf5Error::BadRows {
        file: out.display().to_string(),
        reason: format!("file index {file} of {}", c.files.len()),
    })?;
    let bad = |reason: String| Hdf5Error::BadRows {
        file: cf.path.clone(),
        reason,
    };
    if let Some(w) = rows.windows(2).find(|w| w[0] >= w[1]) {
        return Err(bad(format!(
            "not strictly ascending ({} then {})",
            w[0], w[1]
        )));
    }
    if let Some(&last) = rows.last() {
        if last >= cf.rows {
            return Err(bad(format!("row {last} of a file with {} rows", cf.rows)));
        }
    }
    c.check_unchanged(file)?;
    let r = write_rows(c, cf, rows, out, pacer).and_then(|()| {
        c.check_unchanged(file)?;
        std::fs::metadata(out)
            .map(|m| m.len())
            .map_err(|source| Hdf5Error::Io {
                file: out.display().to_string(),
                source,
            })
    });
    if r.is_err() {
        let _ = std::fs::remove_file(out);
    }
    r
}

fn write_rows(
    c: &Containers,
    cf: &ContainerFile,
    rows: &[u64],
    out: &Path,
    pacer: &Pacer,
) -> Result<()> {
    let cx = Cx { file: &cf.path };
    let ox = OutCx(out.display().to_string());
    let ocx = Cx { file: &ox.0 };
    let src = open_file(cx, &c.root.join(&cf.path), H5P_DEFAULT)?;
    let cout = cstring(ocx, &out.to_string_lossy())?;
    let dst = ocx.id(
        || "create".into(),
        || unsafe { h5f::H5Fcreate(cout.as_ptr(), h5f::H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT) },
    )?;
    close_on_exec(dst.0);
    {
        // Attributes live on the root group, not on the file id.
        let root = c"/";
        let sr = cx.id(
            || "open root group".into(),
            || unsafe { h5g::H5Gopen2(src.0, root.as_ptr(), H5P_DEFAULT) },
        )?;
        let dr = ocx.id(
            || "open root group".into(),
            || unsafe { h5g::H5Gopen2(dst.0, root.as_ptr(), H5P_DEFAULT) },
        )?;
        copy_attrs(cx, ocx, sr.0, dr.0)?;
    }
    for g in &cf.groups {
        let cg = cstring(cx, g)?;
        let sg = cx.id(
            || format!("open group `{g}`"),
            || unsafe { h5g::H5Gopen2(src.0, cg.as_ptr(), H5P_DEFAULT) },
        )?;
        let gcpl = cx.id(
            || format!("group `{g}` properties"),
            || unsafe { h5g::H5Gget_create_plist(sg.0) },
        )?;
        let dg = ocx.id(
            || format!("create group `{g}`"),
            || unsafe { h5g::H5Gcreate2(dst.0, cg.as_ptr(), H5P_DEFAULT, gcpl.0, H5P_DEFAULT) },
        )?;
        copy_attrs(cx, ocx, sg.0, dg.0)?;
    }
    let fd = |p: &Path, shown: &str| {
        std::fs::File::open(p).map_err(|source| Hdf5Error::Io {
            file: shown.to_string(),
            source,
        })
    };
    let fds = Fds {
        src: fd(&c.root.join(&cf.path), &cf.path)?,
        out: fd(out, &ox.0)?,
    };
    // One buffer for every block of every dataset; u64 elements keep it aligned for the
    // pointers variable-length reads put in it.
    let mut buf: Vec<u64> = Vec::new();
    for ds in &cf.datasets {
        copy_dataset_rows(cx, ocx, src.0, dst.0, ds, rows, pacer, &mut buf, &fds)?;
    }
    drop(buf);
    for s in &cf.side {
        let cs = cstring(cx, s)?;
        ocx.call(
            || format!("copy dataset `{s}`"),
            || unsafe {
                h5o::H5Ocopy(
                    src.0,
                    cs.as_ptr(),
                    dst.0,
                    cs.as_ptr(),
                    H5P_DEFAULT,
                    H5P_DEFAULT,
                )
            },
        )?;
    }
    write_index(ocx, dst.0, rows)?;
    ocx.call(
        || "flush".into(),
        || unsafe { h5f::H5Fflush(dst.0, h5f::H5F_scope_t::H5F_SCOPE_LOCAL) },
    )?;
    drop(dst);
    Ok(())
}

/// Owned name of the output file for error messages.
struct OutCx(String);

/// Copies every attribute of `from` to `to`, byte for byte in the attribute's own type.
/// Attributes holding references are skipped: they would point into the source file.
fn copy_attrs(cx: Cx, ocx: Cx, from: hid_t, to: hid_t) -> Result<()> {
    #[allow(deprecated)]
    let n = cx.call(
        || "count attributes".into(),
        || unsafe { h5a::H5Aget_num_attrs(from) },
    )?;
    for i in 0..n as u64 {
        let a = open_attr_by_idx(cx, from, i)?;
        let mut name = vec![0 as c_char; 1024];
        let len = locked(|| unsafe { h5a::H5Aget_name(a.0, name.len(), name.as_mut_ptr()) });
        if len < 0 {
            return Err(cx.lib("attribute name", "failed"));
        }
        if len as usize >= name.len() {
            name = vec![0 as c_char; len as usize + 1];
            locked(|| unsafe { h5a::H5Aget_name(a.0, name.len(), name.as_mut_ptr()) });
        }
        let shown = unsafe { CStr::from_ptr(name.as_ptr()) }
            .to_string_lossy()
            .into_owned();
        let ft = cx.id(
            || format!("type of attribute `{shown}`"),
            || unsafe { h5a::H5Aget_type(a.0) },
        )?;
        let (problem, _) = type_traits(ft.0);
        if problem.is_some() {
            tracing::debug!(file = cx.file, attribute = %shown, "attribute holds references; not copied");
            continue;
        }
        // A transient copy: a committed datatype of the source cannot be used in another file.
        let t = cx.id(
            || "copy attribute type".into(),
            || unsafe { h5t::H5Tcopy(ft.0) },
        )?;
        let space = cx.id(
            || "attribute dataspace".into(),
            || unsafe { h5a::H5Aget_space(a.0) },
        )?;
        let npoints =
            locked(|| unsafe { h5s::H5Sget_simple_extent_npoints(space.0) }).max(0) as usize;
        let size = locked(|| unsafe { h5t::H5Tget_size(t.0) });
        let na = ocx.id(
            || format!("create attribute `{shown}`"),
            || unsafe {
                h5a::H5Acreate2(to, name.as_ptr(), t.0, space.0, H5P_DEFAULT, H5P_DEFAULT)
            },
        )?;
        if npoints == 0 {
            continue;
        }
        let mut buf = vec![0u64; (npoints * size).div_ceil(8)];
        cx.call(
            || format!("read attribute `{shown}`"),
            || unsafe { h5a::H5Aread(a.0, t.0, buf.as_mut_ptr().cast()) },
        )?;
        let w = ocx.call(
            || format!("write attribute `{shown}`"),
            || unsafe { h5a::H5Awrite(na.0, t.0, buf.as_ptr().cast()) },
        );
        // Variable-length parts were allocated by the read; a no-op for other types.
        locked(|| unsafe {
            #[allow(deprecated)]
            h5d::H5Dvlen_reclaim(t.0, space.0, H5P_DEFAULT, buf.as_mut_ptr().cast());
        });
        w?;
    }
    Ok(())
}

/// Runs of consecutive values in ascending `rows`: (first, length).
fn runs(rows: &[u64]) -> impl Iterator<Item = (u64, u64)> + '_ {
    let mut i = 0;
    std::iter::from_fn(move || {
        if i >= rows.len() {
            return None;
        }
        let start = rows[i];
        let mut len = 1;
        while i + (len as usize) < rows.len() && rows[i + len as usize] == start + len {
            len += 1;
        }
        i += len as usize;
        Some((start, len))
    })
}

#[allow(clippy::too_many_arguments)]
fn copy_dataset_rows(
    cx: Cx,
    ocx: Cx,
    src: hid_t,
    dst: hid_t,
    ds: &DatasetInfo,
    rows: &[u64],
    pacer: &Pacer,
    buf: &mut Vec<u64>,
    fds: &Fds,
) -> Result<()> {
    let name = ds.name.as_str();
    let filtered = !ds.filters.is_empty();
    let dapl = cx.id(
        || "dataset access properties".into(),
        || unsafe { h5p::H5Pcreate(*h5p::H5P_CLS_DATASET_ACCESS) },
    )?;
    // No source chunk cache. Uncompressed chunks are then read piecewise, only the selected
    // rows' bytes; compressed ones are read in whole-chunk spans (below), so each chunk is
    // decompressed once without a cache. With a cache, libhdf5 1.10.8 held memory in
    // proportion to the chunks read (310 MiB for a 128 MiB mini-epoch), whatever its size.
    cx.call(
        || "chunk cache".into(),
        || unsafe { h5p::H5Pset_chunk_cache(dapl.0, 521, 0, 1.0) },
    )?;
    let d = open_dataset(cx, src, name, dapl.0)?;
    let ft = cx.id(|| "datatype".into(), || unsafe { h5d::H5Dget_type(d.0) })?;
    let t = cx.id(|| "copy datatype".into(), || unsafe { h5t::H5Tcopy(ft.0) })?;
    let fspace = cx.id(|| "dataspace".into(), || unsafe { h5d::H5Dget_space(d.0) })?;
    let rank = ds.trailing.len() + 1;
    let src_max = max_dims(cx, fspace.0, rank)?;
    let nout = rows.len() as u64;

    // Output creation properties: the source's (filters with their parameters, fill value,
    // chunk shape), with the chunk's first dimension capped at the row count.
    let sdcpl = cx.id(
        || "creation properties".into(),
        || unsafe { h5d::H5Dget_create_plist(d.0) },
    )?;
    let layout = locked(|| unsafe { h5p::H5Pget_layout(sdcpl.0) });
    let external = locked(|| unsafe { h5p::H5Pget_external_count(sdcpl.0) }) > 0;
    let fresh = external
        || !matches!(
            layout,
            H5D_layout_t::H5D_CHUNKED | H5D_layout_t::H5D_CONTIGUOUS | H5D_layout_t::H5D_COMPACT
        );
    let dcpl = if fresh {
        // Virtual or external storage refers to other files: stage plain contiguous data.
        cx.id(
            || "creation properties".into(),
            || unsafe { h5p::H5Pcreate(*h5p::H5P_CLS_DATASET_CREATE) },
        )?
    } else {
        cx.id(
            || "copy creation properties".into(),
            || unsafe { h5p::H5Pcopy(sdcpl.0) },
        )?
    };
    let mut out_chunk0 = 1u64;
    let mut maxdims = src_max.clone();
    maxdims[0] = nout;
    if let (Some(chunk), false) = (&ds.chunk, fresh) {
        let mut oc = chunk.clone();
        oc[0] = oc[0].min(nout.max(1));
        out_chunk0 = oc[0];
        if nout == 0 || src_max[0] == H5S_UNLIMITED {
            maxdims[0] = H5S_UNLIMITED;
        }
        ocx.call(
            || format!("chunk shape of `{name}`"),
            || unsafe { h5p::H5Pset_chunk(dcpl.0, rank as i32, oc.as_ptr()) },
        )?;
        for f in &ds.dropped_filters {
            tracing::debug!(file = cx.file, dataset = name, filter = %f, "filter cannot encode; staged without it");
        }
        if !ds.dropped_filters.is_empty() {
            for (id, _, _, enc) in filters(cx, sdcpl.0)? {
                if !enc {
                    locked(|| unsafe { h5p::H5Premove_filter(dcpl.0, id) });
                }
            }
        }
    } else {
        maxdims[1..].copy_from_slice(&ds.trailing);
    }
    if !ds.vlen {
        // Every element gets written: filling storage first would write it twice.
        locked(|| unsafe { h5p::H5Pset_fill_time(dcpl.0, H5D_fill_time_t::H5D_FILL_TIME_NEVER) });
    }
    let mut odims = vec![nout];
    odims.extend_from_slice(&ds.trailing);
    let ospace = simple_space(ocx, &odims, Some(&maxdims))?;
    let odapl = cx.id(
        || "dataset access properties".into(),
        || unsafe { h5p::H5Pcreate(*h5p::H5P_CLS_DATASET_ACCESS) },
    )?;
    // Blocks are whole chunks: nothing to keep cached between writes.
    cx.call(
        || "chunk cache".into(),
        || unsafe { h5p::H5Pset_chunk_cache(odapl.0, 521, 0, 1.0) },
    )?;
    // Intermediate groups exist already (recreated from the source's).
    let cname = cstring(cx, name)?;
    let od = ocx.id(
        || format!("create dataset `{name}`"),
        || unsafe {
            h5d::H5Dcreate2(
                dst,
                cname.as_ptr(),
                t.0,
                ospace.0,
                H5P_DEFAULT,
                dcpl.0,
                odapl.0,
            )
        },
    )?;
    copy_attrs(cx, ocx, d.0, od.0)?;

    // Block size: whole output chunks, about BLOCK_BYTES, at least one chunk.
    let mem_row = ds.trailing.iter().product::<u64>() * ds.elem_size;
    let chunks_per_block = (BLOCK_BYTES as u64 / (out_chunk0 * mem_row).max(1)).max(1);
    let block_rows = (chunks_per_block * out_chunk0) as usize;
    let need = (block_rows.min(rows.len()) as u64 * mem_row).div_ceil(8) as usize;
    if buf.len() < need {
        buf.resize(need, 0);
    }
    // Rows of compressed chunks read around the selected ones (see `Source::read_spans`).
    let mut scratch: Vec<u64> = Vec::new();
    let src_rows = space_dims(cx, fspace.0)?
        .and_then(|d| d.first().copied())
        .unwrap_or(0);
    let mut start = vec![0 as hsize_t; rank];
    let count = vec![1 as hsize_t; rank];
    let mut block = vec![0 as hsize_t; rank];
    block[1..].copy_from_slice(&ds.trailing);
    let placement = placement(d.0, ds);
    let blocks: Vec<&[u64]> = rows.chunks(block_rows.max(1)).collect();
    if let Some(b) = blocks.first() {
        hint_rows(d.0, ds, &placement, b, &fds.src);
    }
    let mut out_row = 0u64;
    for (bi, part) in blocks.iter().enumerate() {
        let len = part.len() as u64;
        pacer.consume_blocking(len * ds.row_bytes);
        // The next block's rows are fetched by the kernel while this one is copied.
        if let Some(next) = blocks.get(bi + 1) {
            hint_rows(d.0, ds, &placement, next, &fds.src);
        }
        let mut mdims = vec![len];
        mdims.extend_from_slice(&ds.trailing);
        let mspace = simple_space(cx, &mdims, None)?;
        let src = Source {
            cx,
            d: d.0,
            t: t.0,
            fspace: fspace.0,
            ds,
            rows: src_rows,
            mem_row,
        };
        match (filtered && !ds.vlen, &ds.chunk) {
            (true, Some(c)) => src.read_spans(part, c[0].max(1), buf, &mut scratch)?,
            _ => src.read_runs(part, mspace.0, buf)?,
        }
        // The write takes the whole buffer.
        locked(|| unsafe { h5s::H5Sselect_all(mspace.0) });
        start[0] = out_row;
        block[0] = len;
        ocx.call(
            || format!("select rows of `{name}`"),
            || unsafe {
                h5s::H5Sselect_hyperslab(
                    ospace.0,
                    H5S_seloper_t::H5S_SELECT_SET,
                    start.as_ptr(),
                    std::ptr::null(),
                    count.as_ptr(),
                    block.as_ptr(),
                )
            },
        )?;
        let w = ocx.call(
            || format!("write rows of `{name}`"),
            || unsafe {
                h5d::H5Dwrite(
                    od.0,
                    t.0,
                    mspace.0,
                    ospace.0,
                    H5P_DEFAULT,
                    buf.as_ptr().cast(),
                )
            },
        );
        if ds.vlen {
            locked(|| unsafe {
                #[allow(deprecated)]
                h5d::H5Dvlen_reclaim(t.0, mspace.0, H5P_DEFAULT, buf.as_mut_ptr().cast());
            });
        }
        w?;
        out_row += len;
        // Start writing this block back now rather than all of it at the caller's fsync,
        // so reads and writes overlap; this does not wait for the disk.
        crate::tier::start_writeback(&fds.out, 0, 0);
    }
    Ok(())
}

/// One source row dataset, open for reading rows into a block buffer.
struct Source<'a> {
    cx: Cx<'a>,
    d: hid_t,
    /// Memory type: a copy of the file type, so nothing is converted.
    t: hid_t,
    fspace: hid_t,
    ds: &'a DatasetInfo,
    /// Rows of the source dataset.
    rows: u64,
    /// Bytes of one row in memory.
    mem_row: u64,
}

/// `v` as bytes (any bit pattern is a valid `u8`, and `u8` needs no alignment).
fn as_bytes_mut(v: &mut [u64]) -> &mut [u8] {
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<u8>(), v.len() * 8) }
}

impl Source<'_> {
    /// Selects rows `[r0, r0 + n)` of `space` (rank of the dataset, whole trailing extent).
    fn select(&self, space: hid_t, r0: u64, n: u64) -> Result<()> {
        let rank = self.ds.trailing.len() + 1;
        let mut start = vec![0 as hsize_t; rank];
        let count = vec![1 as hsize_t; rank];
        let mut block = vec![n; rank];
        block[1..].copy_from_slice(&self.ds.trailing);
        start[0] = r0;
        self.cx
            .call(
                || format!("select rows of `{}`", self.ds.name),
                || unsafe {
                    h5s::H5Sselect_hyperslab(
                        space,
                        H5S_seloper_t::H5S_SELECT_SET,
                        start.as_ptr(),
                        std::ptr::null(),
                        count.as_ptr(),
                        block.as_ptr(),
                    )
                },
            )
            .map(|_| ())
    }

    fn read(&self, mspace: hid_t, buf: *mut c_void, what: impl FnOnce() -> String) -> Result<()> {
        self.cx
            .call(what, || unsafe {
                h5d::H5Dread(self.d, self.t, mspace, self.fspace, H5P_DEFAULT, buf)
            })
            .map(|_| ())
    }

    /// Reads `part` into consecutive rows of `buf`, one read per run of neighbouring rows,
    /// each a single regular hyperslab. A union of runs in one read would be one call, but
    /// HDF5 1.10 maps an irregular selection onto chunks element by element, which costs 200
    /// times the CPU of the copy. `mspace` is the buffer's dataspace (`part.len()` rows); it
    /// is left with everything selected.
    fn read_runs(&self, part: &[u64], mspace: hid_t, buf: &mut [u64]) -> Result<()> {
        let mut at = 0u64;
        for (r0, n) in runs(part) {
            self.select(self.fspace, r0, n)?;
            self.select(mspace, at, n)?;
            self.read(mspace, buf.as_mut_ptr().cast(), || {
                format!("read rows {r0}..{} of `{}`", r0 + n, self.ds.name)
            })?;
            at += n;
        }
        locked(|| unsafe { h5s::H5Sselect_all(mspace) });
        Ok(())
    }

    /// Reads `part` into consecutive rows of `buf` for a compressed source with chunks of `c0`
    /// rows: each span of neighbouring chunks holding selected rows is read whole (so every
    /// chunk is decompressed once, with no chunk cache) into `scratch`, at most
    /// [`BLOCK_BYTES`] (or one chunk) at a time, and the selected rows copied out. Chunks with
    /// no selected row are not read.
    fn read_spans(
        &self,
        part: &[u64],
        c0: u64,
        buf: &mut [u64],
        scratch: &mut Vec<u64>,
    ) -> Result<()> {
        let row = self.mem_row as usize;
        let piece = ((BLOCK_BYTES as u64 / self.mem_row.max(1)) / c0 * c0).max(c0);
        let mut i = 0;
        let mut at = 0usize;
        while i < part.len() {
            let first = part[i] / c0;
            let s = first * c0;
            let mut last = first;
            let mut j = i;
            while j < part.len() {
                let ci = part[j] / c0;
                if ci > last + 1 || (ci + 1) * c0 - s > piece {
                    break;
                }
                last = ci;
                j += 1;
            }
            let e = ((last + 1) * c0).min(self.rows);
            let need = ((e - s) as usize * row).div_ceil(8);
            if scratch.len() < need {
                scratch.resize(need, 0);
            }
            let mut mdims = vec![e - s];
            mdims.extend_from_slice(&self.ds.trailing);
            let mspace = simple_space(self.cx, &mdims, None)?;
            self.select(self.fspace, s, e - s)?;
            self.read(mspace.0, scratch.as_mut_ptr().cast(), || {
                format!("read rows {s}..{e} of `{}`", self.ds.name)
            })?;
            let (src, dst) = (as_bytes_mut(scratch), as_bytes_mut(buf));
            for &r in &part[i..j] {
                let from = (r - s) as usize * row;
                dst[at * row..(at + 1) * row].copy_from_slice(&src[from..from + row]);
                at += 1;
            }
            i = j;
        }
        Ok(())
    }
}

/// Plain descriptors of the source and output files, beside HDF5's own: for read-ahead hints
/// on the source and early writeback of the output.
struct Fds {
    src: std::fs::File,
    out: std::fs::File,
}

/// Where a row dataset's rows lie in the source file, for read-ahead hints.
enum Placement {
    /// Contiguous storage at this file offset: row `r` at `offset + r * row bytes`.
    Contiguous(u64),
    /// Uncompressed chunks spanning whole rows: a row's bytes are contiguous in its chunk.
    RowChunks,
    /// Other chunked storage: a row's bytes are spread over whole chunks.
    Chunks,
    /// Compact storage, unallocated storage or variable-length data (in the global heap):
    /// nothing worth a hint.
    None,
}

fn placement(d: hid_t, ds: &DatasetInfo) -> Placement {
    if ds.vlen {
        return Placement::None;
    }
    match &ds.chunk {
        None => {
            let off = locked(|| unsafe { h5d::H5Dget_offset(d) });
            if off == hdf5_sys::h5::HADDR_UNDEF {
                Placement::None
            } else {
                Placement::Contiguous(off)
            }
        }
        Some(c) if ds.filters.is_empty() && c[1..] == ds.trailing[..] => Placement::RowChunks,
        Some(_) => Placement::Chunks,
    }
}

/// File range of the stored chunk whose first element is at `coord`, if it is allocated.
fn chunk_range(d: hid_t, coord: &[u64]) -> Option<(u64, u64)> {
    let (mut mask, mut addr, mut size) = (0 as c_uint, 0, 0 as hsize_t);
    let r = locked(|| unsafe {
        h5d::H5Dget_chunk_info_by_coord(d, coord.as_ptr(), &mut mask, &mut addr, &mut size)
    });
    (r >= 0 && addr != hdf5_sys::h5::HADDR_UNDEF && size > 0).then_some((addr, size))
}

/// Asks the kernel to start reading the source bytes of `rows` (ascending) now, so that many
/// reads are in flight at once instead of HDF5's one at a time. Advisory: failures are
/// ignored, and the reads that follow are correct either way.
fn hint_rows(d: hid_t, ds: &DatasetInfo, placement: &Placement, rows: &[u64], fd: &std::fs::File) {
    let row_bytes = ds.trailing.iter().product::<u64>() * ds.elem_size;
    let mut ranges: Vec<(u64, u64)> = Vec::new();
    match placement {
        Placement::None => return,
        Placement::Contiguous(base) => {
            for (r0, n) in runs(rows) {
                ranges.push((base + r0 * row_bytes, n * row_bytes));
            }
        }
        Placement::RowChunks => {
            let c0 = ds.chunk.as_ref().map_or(1, |c| c[0]).max(1);
            let mut coord = vec![0u64; ds.trailing.len() + 1];
            let mut last: Option<(u64, Option<(u64, u64)>)> = None;
            for (r0, n) in runs(rows) {
                let mut r = r0;
                while r < r0 + n {
                    let ci = r / c0;
                    let end = ((ci + 1) * c0).min(r0 + n);
                    let chunk = match last {
                        Some((i, c)) if i == ci => c,
                        _ => {
                            coord[0] = ci * c0;
                            let c = chunk_range(d, &coord);
                            last = Some((ci, c));
                            c
                        }
                    };
                    if let Some((addr, _)) = chunk {
                        ranges.push((addr + (r - ci * c0) * row_bytes, (end - r) * row_bytes));
                    }
                    r = end;
                }
            }
        }
        Placement::Chunks => {
            let Some(chunk) = ds.chunk.as_ref() else {
                return;
            };
            let c0 = chunk[0].max(1);
            // Chunk grid positions across the trailing dimensions.
            let grid: Vec<u64> = ds
                .trailing
                .iter()
                .zip(&chunk[1..])
                .map(|(&t, &c)| t.div_ceil(c.max(1)))
                .collect();
            let per_row: u64 = grid.iter().product();
            let mut last_ci = None;
            for &r in rows {
                let ci = r / c0;
                if last_ci == Some(ci) {
                    continue;
                }
                last_ci = Some(ci);
                for k in 0..per_row {
                    let mut coord = vec![ci * c0];
                    let mut rest = k;
                    for (g, c) in grid.iter().zip(&chunk[1..]).rev() {
                        coord.push((rest % g) * c);
                        rest /= g;
                    }
                    coord[1..].reverse();
                    if let Some(rng) = chunk_range(d, &coord) {
                        ranges.push(rng);
                    }
                }
            }
        }
    }
    ranges.sort_unstable();
    let mut merged: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
    for (o, l) in ranges {
        match merged.last_mut() {
            Some((mo, ml)) if *mo + *ml >= o => *ml = (*ml).max(o + l - *mo),
            _ => merged.push((o, l)),
        }
    }
    for (o, l) in merged {
        unsafe {
            libc::posix_fadvise(
                fd.as_raw_fd(),
                o as libc::off_t,
                l as libc::off_t,
                libc::POSIX_FADV_WILLNEED,
            );
        }
    }
}

/// Writes `metfs_index`: the source row of each output row.
fn write_index(ocx: Cx, dst: hid_t, rows: &[u64]) -> Result<()> {
    let space = simple_space(ocx, &[rows.len() as u64], None)?;
    let name = cstring(ocx, INDEX_DATASET)?;
    let le = locked(|| *h5t::H5T_STD_U64LE);
    let d = ocx.id(
        || format!("create `{INDEX_DATASET}`"),
        || unsafe {
            h5d::H5Dcreate2(
                dst,
                name.as_ptr(),
                le,
                space.0,
                H5P_DEFAULT,
                H5P_DEFAULT,
                H5P_DEFAULT,
            )
        },
    )?;
    if rows.is_empty() {
        return Ok(());
    }
    let native = locked(|| *h5t::H5T_NATIVE_UINT64);
    ocx.call(
        || format!("write `{INDEX_DATASET}`"),
        || unsafe {
            h5d::H5Dwrite(
                d.0,
                native,
                H5S_ALL,
                H5S_ALL,
                H5P_DEFAULT,
                rows.as_ptr().cast(),
            )
        },
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_coalesce_neighbours() {
        let r: Vec<_> = runs(&[1, 2, 3, 7, 9, 10]).collect();
        assert_eq!(r, vec![(1, 3), (7, 1), (9, 2)]);
        assert_eq!(runs(&[]).count(), 0);
    }

    #[test]
    fn digits_of_last_row() {
        assert_eq!(digits(0), 1);
        assert_eq!(digits(9), 1);
        assert_eq!(digits(10), 2);
        assert_eq!(digits(9_999_999), 7);
    }
}
