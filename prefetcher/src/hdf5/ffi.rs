//! The thin layer over the raw library: owned ids, checked calls under the global lock, and
//! the small inspections (dataspaces, datatypes, attributes, filters) everything else builds on.

use std::ffi::{CStr, CString};
use std::os::raw::{c_char, c_uint, c_void};
use std::path::Path;

use hdf5_sys::h5::{hsize_t, H5_index_t, H5_iter_order_t};
use hdf5_sys::h5d::{self};
use hdf5_sys::h5i::hid_t;
use hdf5_sys::h5p::H5P_DEFAULT;
use hdf5_sys::h5t::{H5T_class_t, H5T_sign_t};
use hdf5_sys::{h5a, h5f, h5i, h5l, h5p, h5s, h5t, h5z};

use super::*;

// ---------------------------------------------------------------------------------------------
// Thin layer over the raw library: owned ids and checked calls under the global lock.

/// An HDF5 id owned by us, released with `H5Idec_ref` (which closes any kind of object when
/// its count drops to zero) under the library lock.
pub(super) struct Hid(pub(super) hid_t);

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
pub(super) trait Code: Copy {
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
pub(super) struct Cx<'a> {
    pub(super) file: &'a str,
}

impl Cx<'_> {
    pub(super) fn lib(&self, what: impl Into<String>, detail: impl Into<String>) -> Hdf5Error {
        Hdf5Error::Library {
            file: self.file.to_string(),
            what: what.into(),
            detail: detail.into(),
        }
    }

    /// Runs one library call under the lock; on failure, reads HDF5's error stack in the same
    /// critical section (the serial library's stack is global, another thread's call could
    /// overwrite it).
    pub(super) fn call<T: Code>(
        &self,
        what: impl FnOnce() -> String,
        f: impl FnOnce() -> T,
    ) -> Result<T> {
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
    pub(super) fn id(
        &self,
        what: impl FnOnce() -> String,
        f: impl FnOnce() -> hid_t,
    ) -> Result<Hid> {
        self.call(what, f).map(Hid)
    }
}

/// Runs `f` under the library lock (for calls that cannot fail or whose failure is handled).
pub(super) fn locked<T>(f: impl FnOnce() -> T) -> T {
    ::hdf5::sync::sync(f)
}

pub(super) fn cstring(cx: Cx, s: &str) -> Result<CString> {
    CString::new(s).map_err(|_| cx.lib(format!("name `{s}`"), "contains a NUL byte"))
}

/// Opens `path` read-only after checking that it is readable and is HDF5.
pub(super) fn open_file(cx: Cx, path: &Path, fapl: hid_t) -> Result<Hid> {
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
pub(super) fn close_on_exec(file: hid_t) {
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
pub(super) fn link_exists(cx: Cx, loc: hid_t, path: &str) -> Result<bool> {
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
pub(super) fn space_dims(cx: Cx, space: hid_t) -> Result<Option<Vec<u64>>> {
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

pub(super) fn max_dims(cx: Cx, space: hid_t, rank: usize) -> Result<Vec<u64>> {
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

pub(super) fn simple_space(cx: Cx, dims: &[u64], maxdims: Option<&[u64]>) -> Result<Hid> {
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
pub(super) fn type_traits(t: hid_t) -> (Option<&'static str>, bool) {
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
pub(super) unsafe fn has_vlen_string(t: hid_t) -> bool {
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
pub(super) fn describe_type(t: hid_t) -> String {
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

pub(super) fn open_dataset(cx: Cx, file: hid_t, name: &str, dapl: hid_t) -> Result<Hid> {
    let c = cstring(cx, name)?;
    cx.id(
        || format!("open dataset `{name}`"),
        || unsafe { h5d::H5Dopen2(file, c.as_ptr(), dapl) },
    )
}

pub(super) fn attr_names(cx: Cx, obj: hid_t) -> Result<Vec<String>> {
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
pub(super) fn open_attr_by_idx(cx: Cx, obj: hid_t, i: u64) -> Result<Hid> {
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
pub(super) fn filters(cx: Cx, dcpl: hid_t) -> Result<Vec<(i32, String, bool, bool)>> {
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
