//! The thin layer over the raw library, and the only place in the crate's HDF5 code that says
//! `unsafe`: owned ids, checked calls under the global lock, and one safe wrapper per library
//! call the other modules need.
//!
//! # Why the wrappers are sound
//!
//! * **Ids.** Every id-taking call validates its ids against the library's id tables and fails
//!   (a negative return) on a stale, closed or wrong-kind id; it never dereferences one blindly.
//!   So the wrappers take plain `hid_t`s: a wrong id is an error, not undefined behaviour.
//! * **Names.** Names cross as `&CStr` (or a `CString` made here), so they are NUL-terminated
//!   and live for the call.
//! * **Arrays.** Coordinate and shape arrays are Rust slices whose length is checked against
//!   the rank the library will read or write through the pointer, before the call.
//! * **Buffers.** Reads and writes check that the buffer holds the whole memory dataspace
//!   extent times the memory type's size, the bytes the library may touch. Variable-length
//!   data (whose buffers hold pointers the library allocated, and which must be reclaimed) never
//!   crosses this boundary: [`io::read_vlen_strings`], [`io::copy_vlen_rows`] and
//!   [`attrs::copy_attr_data`] read, use and reclaim such buffers here, so no caller can hand the
//!   library a forged pointer to free or follow.
//! * **Locking.** The system libhdf5 is not thread-safe; every call runs under the `hdf5`
//!   crate's global reentrant lock ([`locked`], [`Cx::call`]).

use std::ffi::{CStr, CString};
use std::os::raw::c_void;
use std::path::Path;

use hdf5_sys::h5d;
use hdf5_sys::h5i::hid_t;
use hdf5_sys::h5p::H5P_DEFAULT;
use hdf5_sys::{h5f, h5g, h5i, h5l, h5o, h5p};

use super::{Hdf5Error, Result};

pub(super) mod attrs;
pub(super) mod io;
pub(super) mod space;
pub(super) mod types;

/// An HDF5 id owned by us, released with `H5Idec_ref` (which closes any kind of object when
/// its count drops to zero) under the library lock.
pub(in crate::hdf5) struct Hid(pub(in crate::hdf5) hid_t);

impl Drop for Hid {
    fn drop(&mut self) {
        if self.0 > 0 {
            // SAFETY: takes an id by value; the library checks it (an invalid one is an error).
            ::hdf5::sync::sync(|| unsafe {
                h5i::H5Idec_ref(self.0);
            });
        }
    }
}

/// Return codes of the library: negative means failure (`hid_t`, `herr_t`, `htri_t`, …).
pub(in crate::hdf5) trait Code: Copy {
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
pub(in crate::hdf5) struct Cx<'a> {
    pub(in crate::hdf5) file: &'a str,
}

impl Cx<'_> {
    pub(in crate::hdf5) fn lib(
        &self,
        what: impl Into<String>,
        detail: impl Into<String>,
    ) -> Hdf5Error {
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

pub(in crate::hdf5) fn cstring(cx: Cx, s: &str) -> Result<CString> {
    CString::new(s).map_err(|_| cx.lib(format!("name `{s}`"), "contains a NUL byte"))
}

/// Opens `path` read-only (default file access: the sec2 driver) after checking that it is
/// readable and is HDF5.
pub(in crate::hdf5) fn open_file(cx: Cx, path: &Path) -> Result<Hid> {
    std::fs::File::open(path).map_err(|source| Hdf5Error::Io {
        file: cx.file.to_string(),
        source,
    })?;
    let c = cstring(cx, &path.to_string_lossy())?;
    // SAFETY: `c` is NUL-terminated and outlives the call.
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
            // SAFETY: `c` is NUL-terminated and outlives the call; H5P_DEFAULT is a valid
            // property list id.
            || unsafe { h5f::H5Fopen(c.as_ptr(), h5f::H5F_ACC_RDONLY, H5P_DEFAULT) },
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

/// Creates (or truncates) `path` with default properties (the sec2 driver), close-on-exec.
pub(in crate::hdf5) fn create_file(cx: Cx, path: &Path) -> Result<Hid> {
    let c = cstring(cx, &path.to_string_lossy())?;
    let f = cx.id(
        || "create".into(),
        // SAFETY: `c` is NUL-terminated and outlives the call; the property lists are the
        // library's defaults.
        || unsafe { h5f::H5Fcreate(c.as_ptr(), h5f::H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT) },
    )?;
    close_on_exec(f.0);
    Ok(f)
}

/// Marks the descriptor under an open HDF5 file close-on-exec. HDF5 opens files without
/// `O_CLOEXEC` and holds an `flock` on them (1.10 and later), so a child process started by
/// another thread meanwhile would inherit the descriptor and its lock, and every later open of
/// that file elsewhere (h5py reading a staged file) would fail with "unable to lock file" for
/// as long as the child lives. A fork between the open and this call can still leak it.
///
/// Only for files opened here with default access ([`open_file`], [`create_file`]).
fn close_on_exec(file: hid_t) {
    let mut handle: *mut c_void = std::ptr::null_mut();
    // SAFETY: `handle` is a valid place for the library to store one pointer; the id is checked.
    let r = locked(|| unsafe { h5f::H5Fget_vfd_handle(file, H5P_DEFAULT, &mut handle) });
    if r >= 0 && !handle.is_null() {
        // SAFETY: the file was opened by `open_file` or `create_file` with default access, i.e.
        // the sec2 driver, whose handle points at its `int` descriptor, alive while the file is
        // open (our caller holds the id). fcntl on a descriptor touches no memory of ours.
        unsafe {
            let fd = *(handle as *const i32);
            let flags = libc::fcntl(fd, libc::F_GETFD);
            if flags >= 0 {
                libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC);
            }
        }
    }
}

/// An [`::hdf5::File`] sharing the open file `file` (it takes a reference of its own), so the
/// `hdf5` crate's portable group walking can be used on it.
pub(in crate::hdf5) fn high_level_file(cx: Cx, file: &Hid) -> Result<::hdf5::File> {
    cx.call(
        || "open".into(),
        // SAFETY: takes an id by value; the library checks it.
        || unsafe { h5i::H5Iinc_ref(file.0) },
    )?;
    // SAFETY: `file.0` is a valid file id (it is owned by `file`, alive here), and the extra
    // reference taken above is the one the `File` now owns and releases on drop.
    unsafe { ::hdf5::from_id(file.0) }.map_err(|e| cx.lib("open", e.to_string()))
}

/// True when the link `path` (possibly nested, `a/b/c`) exists under `loc`, checking each
/// level so that a missing intermediate group is a "no", not a library error.
pub(in crate::hdf5) fn link_exists(cx: Cx, loc: hid_t, path: &str) -> Result<bool> {
    let mut prefix = String::new();
    for seg in path.split('/').filter(|s| !s.is_empty()) {
        if !prefix.is_empty() {
            prefix.push('/');
        }
        prefix.push_str(seg);
        let c = cstring(cx, &prefix)?;
        let r = cx.call(
            || format!("look up `{prefix}`"),
            // SAFETY: `c` is NUL-terminated and outlives the call; ids are checked.
            || unsafe { h5l::H5Lexists(loc, c.as_ptr(), H5P_DEFAULT) },
        )?;
        if r == 0 {
            return Ok(false);
        }
    }
    Ok(!prefix.is_empty())
}

/// True when `name` under `loc` is a dataset (an existing link to one).
pub(in crate::hdf5) fn is_dataset(cx: Cx, loc: hid_t, name: &CStr) -> Result<bool> {
    // SAFETY: `name` is NUL-terminated and outlives the call; ids are checked.
    let exists = locked(|| unsafe { h5o::H5Oexists_by_name(loc, name.as_ptr(), H5P_DEFAULT) });
    if exists <= 0 {
        return Ok(false);
    }
    let obj = cx.id(
        || format!("open `{}`", name.to_string_lossy()),
        // SAFETY: as above.
        || unsafe { h5o::H5Oopen(loc, name.as_ptr(), H5P_DEFAULT) },
    )?;
    // SAFETY: takes an id by value; the library checks it.
    Ok(locked(|| unsafe { h5i::H5Iget_type(obj.0) }) == h5i::H5I_type_t::H5I_DATASET)
}

/// Opens dataset `name` of `loc` with access properties `dapl`.
pub(in crate::hdf5) fn open_dataset(cx: Cx, loc: hid_t, name: &str, dapl: hid_t) -> Result<Hid> {
    let c = cstring(cx, name)?;
    cx.id(
        || format!("open dataset `{name}`"),
        // SAFETY: `c` is NUL-terminated and outlives the call; ids are checked.
        || unsafe { h5d::H5Dopen2(loc, c.as_ptr(), dapl) },
    )
}

/// The dataspace of dataset `d` (a copy the result owns).
pub(in crate::hdf5) fn dataset_space(cx: Cx, d: hid_t) -> Result<Hid> {
    // SAFETY: takes an id by value; the library checks it.
    cx.id(|| "dataspace".into(), || unsafe { h5d::H5Dget_space(d) })
}

/// The datatype of dataset `d`.
pub(in crate::hdf5) fn dataset_type(cx: Cx, d: hid_t) -> Result<Hid> {
    // SAFETY: takes an id by value; the library checks it.
    cx.id(|| "datatype".into(), || unsafe { h5d::H5Dget_type(d) })
}

/// A copy of the creation property list of dataset `d`.
pub(in crate::hdf5) fn dataset_create_plist(cx: Cx, d: hid_t) -> Result<Hid> {
    cx.id(
        || "creation properties".into(),
        // SAFETY: takes an id by value; the library checks it.
        || unsafe { h5d::H5Dget_create_plist(d) },
    )
}

/// Bytes dataset `d` occupies in its file (0 when unknown).
pub(in crate::hdf5) fn dataset_storage_size(d: hid_t) -> u64 {
    // SAFETY: takes an id by value; the library checks it (0 on failure).
    locked(|| unsafe { h5d::H5Dget_storage_size(d) })
}

/// File offset of a contiguous dataset's data, `None` when it has none (chunked, compact,
/// unallocated).
pub(in crate::hdf5) fn dataset_offset(d: hid_t) -> Option<u64> {
    // SAFETY: takes an id by value; the library checks it (HADDR_UNDEF on failure).
    let off = locked(|| unsafe { h5d::H5Dget_offset(d) });
    (off != hdf5_sys::h5::HADDR_UNDEF).then_some(off)
}

/// File range (address, bytes) of the stored chunk of `d` whose first element is at `coord`,
/// if it is allocated. `None` too when `coord` does not have the dataset's rank.
pub(in crate::hdf5) fn chunk_range(d: hid_t, coord: &[u64]) -> Option<(u64, u64)> {
    let space = Hid(locked(|| {
        // SAFETY: takes an id by value; the library checks it.
        unsafe { h5d::H5Dget_space(d) }
    }));
    if space::rank(space.0) != Some(coord.len()) {
        return None;
    }
    let (mut mask, mut addr, mut size) = (0, 0, 0);
    // SAFETY: `coord` holds exactly rank elements, which is what the library reads; the three
    // outputs are valid places for one value each.
    let r = locked(|| unsafe {
        h5d::H5Dget_chunk_info_by_coord(d, coord.as_ptr(), &mut mask, &mut addr, &mut size)
    });
    (r >= 0 && addr != hdf5_sys::h5::HADDR_UNDEF && size > 0).then_some((addr, size))
}

/// Creates dataset `name` under `loc` (whose intermediate groups exist).
pub(in crate::hdf5) fn create_dataset(
    cx: Cx,
    loc: hid_t,
    name: &str,
    t: hid_t,
    space: hid_t,
    dcpl: hid_t,
    dapl: hid_t,
) -> Result<Hid> {
    let c = cstring(cx, name)?;
    cx.id(
        || format!("create dataset `{name}`"),
        // SAFETY: `c` is NUL-terminated and outlives the call; ids are checked.
        || unsafe { h5d::H5Dcreate2(loc, c.as_ptr(), t, space, H5P_DEFAULT, dcpl, dapl) },
    )
}

/// Copies object `name` of `src` (with everything under it) to the same path in `dst`.
pub(in crate::hdf5) fn copy_object(cx: Cx, src: hid_t, name: &str, dst: hid_t) -> Result<()> {
    let c = cstring(cx, name)?;
    cx.call(
        || format!("copy dataset `{name}`"),
        // SAFETY: `c` is NUL-terminated and outlives the call; ids are checked.
        || unsafe { h5o::H5Ocopy(src, c.as_ptr(), dst, c.as_ptr(), H5P_DEFAULT, H5P_DEFAULT) },
    )
    .map(|_| ())
}

/// Flushes file `f`'s buffers to the operating system.
pub(in crate::hdf5) fn flush(cx: Cx, f: hid_t) -> Result<()> {
    cx.call(
        || "flush".into(),
        // SAFETY: takes an id by value; the library checks it.
        || unsafe { h5f::H5Fflush(f, h5f::H5F_scope_t::H5F_SCOPE_LOCAL) },
    )
    .map(|_| ())
}

/// Opens group `name` (`/` for the root group) of `loc`.
pub(in crate::hdf5) fn open_group(cx: Cx, loc: hid_t, name: &str) -> Result<Hid> {
    let c = cstring(cx, name)?;
    cx.id(
        || format!("open group `{name}`"),
        // SAFETY: `c` is NUL-terminated and outlives the call; ids are checked.
        || unsafe { h5g::H5Gopen2(loc, c.as_ptr(), H5P_DEFAULT) },
    )
}

/// Creates group `name` under `loc` with the creation properties of group `like`.
pub(in crate::hdf5) fn create_group_like(
    cx: Cx,
    loc: hid_t,
    name: &str,
    like: hid_t,
) -> Result<Hid> {
    let gcpl = cx.id(
        || format!("group `{name}` properties"),
        // SAFETY: takes an id by value; the library checks it.
        || unsafe { h5g::H5Gget_create_plist(like) },
    )?;
    let c = cstring(cx, name)?;
    cx.id(
        || format!("create group `{name}`"),
        // SAFETY: `c` is NUL-terminated and outlives the call; ids are checked.
        || unsafe { h5g::H5Gcreate2(loc, c.as_ptr(), H5P_DEFAULT, gcpl.0, H5P_DEFAULT) },
    )
}

/// A new dataset access property list with the chunk cache off (see the module docs of
/// `hdf5` for why).
pub(in crate::hdf5) fn dapl_without_chunk_cache(cx: Cx) -> Result<Hid> {
    let dapl = cx.id(
        || "dataset access properties".into(),
        // SAFETY: reads the library's class id (initialised by the crate) and creates a list.
        || unsafe { h5p::H5Pcreate(*h5p::H5P_CLS_DATASET_ACCESS) },
    )?;
    cx.call(
        || "chunk cache".into(),
        // SAFETY: takes an id and plain numbers.
        || unsafe { h5p::H5Pset_chunk_cache(dapl.0, 521, 0, 1.0) },
    )?;
    Ok(dapl)
}

/// A new, default dataset creation property list.
pub(in crate::hdf5) fn new_dcpl(cx: Cx) -> Result<Hid> {
    cx.id(
        || "creation properties".into(),
        // SAFETY: reads the library's class id (initialised by the crate) and creates a list.
        || unsafe { h5p::H5Pcreate(*h5p::H5P_CLS_DATASET_CREATE) },
    )
}

/// A copy of property list `p`.
pub(in crate::hdf5) fn copy_plist(cx: Cx, p: hid_t) -> Result<Hid> {
    cx.id(
        || "copy creation properties".into(),
        // SAFETY: takes an id by value; the library checks it.
        || unsafe { h5p::H5Pcopy(p) },
    )
}

/// Storage layout of a dataset creation property list.
pub(in crate::hdf5) fn layout(dcpl: hid_t) -> h5d::H5D_layout_t {
    // SAFETY: takes an id by value; the library checks it.
    locked(|| unsafe { h5p::H5Pget_layout(dcpl) })
}

/// True when the creation property list stores data in external files.
pub(in crate::hdf5) fn has_external(dcpl: hid_t) -> bool {
    // SAFETY: takes an id by value; the library checks it.
    locked(|| unsafe { h5p::H5Pget_external_count(dcpl) }) > 0
}

/// Chunk shape of a chunked creation property list, of `rank` dimensions.
pub(in crate::hdf5) fn chunk_dims(cx: Cx, dcpl: hid_t, rank: usize) -> Result<Vec<u64>> {
    let mut c = vec![0u64; rank];
    cx.call(
        || "chunk shape".into(),
        // SAFETY: the library writes at most `c.len()` dimensions into `c`.
        || unsafe { h5p::H5Pget_chunk(dcpl, c.len() as i32, c.as_mut_ptr()) },
    )?;
    Ok(c)
}

/// Sets the chunk shape of a creation property list.
pub(in crate::hdf5) fn set_chunk(cx: Cx, what: &str, dcpl: hid_t, dims: &[u64]) -> Result<()> {
    cx.call(
        || format!("chunk shape of `{what}`"),
        // SAFETY: the library reads `dims.len()` dimensions from `dims`.
        || unsafe { h5p::H5Pset_chunk(dcpl, dims.len() as i32, dims.as_ptr()) },
    )
    .map(|_| ())
}

/// Removes filter `id` from a creation property list (no-op when absent).
pub(in crate::hdf5) fn remove_filter(dcpl: hid_t, id: i32) {
    // SAFETY: takes an id and a number.
    locked(|| unsafe { h5p::H5Premove_filter(dcpl, id) });
}

/// Never writes fill values into new storage (every element gets written anyway).
pub(in crate::hdf5) fn set_fill_time_never(dcpl: hid_t) {
    // SAFETY: takes an id and an enum value.
    locked(|| unsafe { h5p::H5Pset_fill_time(dcpl, h5d::H5D_fill_time_t::H5D_FILL_TIME_NEVER) });
}

/// Filters of a dataset creation property list: (id, description, decodable, encodable).
pub(in crate::hdf5) fn filters(cx: Cx, dcpl: hid_t) -> Result<Vec<(i32, String, bool, bool)>> {
    use hdf5_sys::h5z;
    use std::os::raw::{c_char, c_uint};
    let n = cx.call(
        || "count filters".into(),
        // SAFETY: takes an id by value; the library checks it.
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
            // SAFETY: `nelmts` says `cd` holds 16 values and `name.len()` bounds the name (the
            // library NUL-terminates it within); the other outputs are single values.
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
                // The array was zeroed and the library writes a NUL-terminated name within
                // it; the last byte stays 0 in any case.
                name[name.len() - 1] = 0;
                // SAFETY: `name` holds a NUL (just set) and outlives the borrow.
                let n = unsafe { CStr::from_ptr(name.as_ptr()) }.to_string_lossy();
                format!("filter {id} ({n})")
            }
        };
        // SAFETY: takes a filter id by value.
        let avail = locked(|| unsafe { h5z::H5Zfilter_avail(id) }) > 0;
        let mut cfg: c_uint = 0;
        // SAFETY: `cfg` is a valid place for one value.
        let info = avail && locked(|| unsafe { h5z::H5Zget_filter_info(id, &mut cfg) }) >= 0;
        let dec = info && cfg & h5z::H5Z_FILTER_CONFIG_DECODE_ENABLED != 0;
        let enc = info && cfg & h5z::H5Z_FILTER_CONFIG_ENCODE_ENABLED != 0;
        out.push((id, desc, dec, enc));
    }
    Ok(out)
}
