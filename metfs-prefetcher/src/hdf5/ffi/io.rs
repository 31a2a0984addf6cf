//! Reading and writing values: fixed-size ones into plain Rust buffers whose size is checked,
//! variable-length ones only inside the functions here that also reclaim them.

use std::ffi::CStr;
use std::os::fd::AsRawFd;
use std::os::raw::c_char;

use hdf5_sys::h5a;
use hdf5_sys::h5d;
use hdf5_sys::h5i::hid_t;
use hdf5_sys::h5p::H5P_DEFAULT;
use hdf5_sys::h5s::H5S_ALL;

use super::space::{extent_points, runs, select_all, select_hyperslab, simple_space};
use super::types::{is_variable_str, type_size, type_traits};
use super::{dataset_space, locked, Cx};
use crate::hdf5::Result;

mod sealed {
    pub trait Sealed {}
}

/// Element types of buffers the library may fill: every bit pattern is a valid value, and none
/// holds a pointer.
pub(in crate::hdf5) trait Plain: Copy + sealed::Sealed {}
macro_rules! plain {
    ($($t:ty),*) => {$(impl sealed::Sealed for $t {} impl Plain for $t {})*};
}
plain!(u8, u64, i64, f32, f64);

/// Where values are read from or written to.
#[derive(Clone, Copy)]
pub(in crate::hdf5) enum Obj {
    /// A dataset, through a memory and a file dataspace (`None`: the dataset's whole space).
    Dataset {
        d: hid_t,
        mspace: Option<hid_t>,
        fspace: Option<hid_t>,
    },
    /// An attribute (always read whole).
    Attribute(hid_t),
}

impl Obj {
    /// Elements in the memory dataspace's extent: what a buffer must hold.
    fn mem_points(self, cx: Cx) -> Result<u64> {
        Ok(match self {
            Obj::Dataset {
                mspace: Some(m), ..
            } => extent_points(m),
            Obj::Dataset {
                fspace: Some(f), ..
            } => extent_points(f),
            Obj::Dataset { d, .. } => extent_points(dataset_space(cx, d)?.0),
            Obj::Attribute(a) => extent_points(super::attrs::attr_space(cx, a)?.0),
        })
    }
}

/// Checks that `bytes` hold the memory extent of `obj` in fixed-size type `t`.
fn check_buffer(cx: Cx, what: &str, obj: Obj, t: hid_t, bytes: usize) -> Result<()> {
    if type_traits(t).1 {
        return Err(cx.lib(what, "variable-length values need a reclaiming read"));
    }
    let need = obj.mem_points(cx)?.saturating_mul(type_size(t) as u64);
    if (bytes as u64) < need {
        return Err(cx.lib(what, format!("buffer of {bytes} bytes for {need}")));
    }
    Ok(())
}

/// Reads the selected values of `obj` in memory type `t` (fixed-size) into `buf`, which must
/// hold the whole memory extent.
pub(in crate::hdf5) fn read<T: Plain>(
    cx: Cx,
    what: impl FnOnce() -> String,
    obj: Obj,
    t: hid_t,
    buf: &mut [T],
) -> Result<()> {
    let what = what();
    check_buffer(cx, &what, obj, t, std::mem::size_of_val(buf))?;
    let p = buf.as_mut_ptr().cast();
    cx.call(
        || what,
        // SAFETY: `buf` holds the memory extent in `t` (checked), all the library writes, and
        // `T` accepts any bytes; `t` has no variable-length parts (checked), so no pointers
        // are written.
        || unsafe {
            match obj {
                Obj::Dataset { d, mspace, fspace } => h5d::H5Dread(
                    d,
                    t,
                    mspace.unwrap_or(H5S_ALL),
                    fspace.unwrap_or(H5S_ALL),
                    H5P_DEFAULT,
                    p,
                ),
                Obj::Attribute(a) => h5a::H5Aread(a, t, p),
            }
        },
    )
    .map(|_| ())
}

/// Writes the selected values of dataset `d` in memory type `t` (fixed-size) from `buf`, which
/// must hold the whole memory extent.
pub(in crate::hdf5) fn write<T: Plain>(
    cx: Cx,
    what: impl FnOnce() -> String,
    d: hid_t,
    mspace: Option<hid_t>,
    fspace: Option<hid_t>,
    t: hid_t,
    buf: &[T],
) -> Result<()> {
    let what = what();
    let obj = Obj::Dataset { d, mspace, fspace };
    check_buffer(cx, &what, obj, t, std::mem::size_of_val(buf))?;
    cx.call(
        || what,
        // SAFETY: `buf` holds the memory extent in `t` (checked), all the library reads; `t`
        // has no variable-length parts (checked), so no bytes are followed as pointers.
        || unsafe {
            h5d::H5Dwrite(
                d,
                t,
                mspace.unwrap_or(H5S_ALL),
                fspace.unwrap_or(H5S_ALL),
                H5P_DEFAULT,
                buf.as_ptr().cast(),
            )
        },
    )
    .map(|_| ())
}

/// Reads the selected values of `obj` as variable-length strings (memory type `t`, a
/// variable-length string type) and returns them as text (a null string as empty).
pub(in crate::hdf5) fn read_vlen_strings(
    cx: Cx,
    what: impl FnOnce() -> String,
    obj: Obj,
    t: hid_t,
) -> Result<Vec<String>> {
    let what = what();
    if !is_variable_str(t) {
        return Err(cx.lib(what, "not a variable-length string type"));
    }
    let n = obj.mem_points(cx)? as usize;
    let mut v: Vec<*mut c_char> = vec![std::ptr::null_mut(); n];
    let p = v.as_mut_ptr().cast();
    let r = cx.call(
        || what,
        // SAFETY: `v` holds one `char *` per element of the memory extent, which is what the
        // library writes for a variable-length string type.
        || unsafe {
            match obj {
                Obj::Dataset { d, mspace, fspace } => h5d::H5Dread(
                    d,
                    t,
                    mspace.unwrap_or(H5S_ALL),
                    fspace.unwrap_or(H5S_ALL),
                    H5P_DEFAULT,
                    p,
                ),
                Obj::Attribute(a) => h5a::H5Aread(a, t, p),
            }
        },
    );
    let out = v
        .iter()
        .map(|&p| {
            if p.is_null() {
                String::new()
            } else {
                // SAFETY: a non-null entry is a NUL-terminated string the read allocated,
                // alive until the reclaim below.
                unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
            }
        })
        .collect();
    let space = simple_space(cx, &[n as u64], None)?;
    // SAFETY: `v` holds `n` string handles of `t`, each null or allocated by the read above,
    // laid out as the 1-D space `space`; nothing else has touched them.
    locked(|| unsafe {
        #[allow(deprecated)]
        h5d::H5Dvlen_reclaim(t, space.0, H5P_DEFAULT, v.as_mut_ptr().cast());
    });
    r.map(|_| out)
}

/// Bytes of variable-length data the selection of `space` in dataset `d` (type `t`) holds.
pub(in crate::hdf5) fn vlen_payload(
    cx: Cx,
    what: &str,
    d: hid_t,
    t: hid_t,
    space: hid_t,
) -> Result<u64> {
    let mut payload = 0u64;
    cx.call(
        || format!("size of variable-length data in `{what}`"),
        // SAFETY: `payload` is a valid place for one value; ids are checked.
        || unsafe { h5d::H5Dvlen_get_buf_size(d, t, space, &mut payload) },
    )?;
    Ok(payload)
}

/// The rows being copied from one source dataset to its staged copy.
pub(in crate::hdf5) struct RowCopy<'a> {
    /// Source dataset, its file dataspace and the memory type (a copy of the file type).
    pub d: hid_t,
    pub fspace: hid_t,
    pub t: hid_t,
    /// Output dataset and its file dataspace.
    pub od: hid_t,
    pub ospace: hid_t,
    /// Shape after axis 0.
    pub trailing: &'a [u64],
    /// Dataset name, for errors.
    pub name: &'a str,
}

impl RowCopy<'_> {
    fn select(&self, cx: Cx, space: hid_t, r0: u64, n: u64) -> Result<()> {
        let rank = self.trailing.len() + 1;
        let mut start = vec![0; rank];
        start[0] = r0;
        let mut block = vec![n; rank];
        block[1..].copy_from_slice(self.trailing);
        select_hyperslab(
            cx,
            || format!("select rows of `{}`", self.name),
            space,
            &start,
            &vec![1; rank],
            Some(&block),
        )
    }

    /// Copies source rows `part` (ascending) of a variable-length dataset to output rows
    /// `out_row..out_row + part.len()`, through `buf`: one read per run of neighbouring rows,
    /// one write, and the reclaim of what the reads allocated.
    pub(in crate::hdf5) fn copy_vlen(
        &self,
        cx: Cx,
        ocx: Cx,
        part: &[u64],
        out_row: u64,
        buf: &mut Vec<u64>,
    ) -> Result<()> {
        let len = part.len() as u64;
        let mut mdims = vec![len];
        mdims.extend_from_slice(self.trailing);
        let mspace = simple_space(cx, &mdims, None)?;
        let bytes = extent_points(mspace.0) as usize * type_size(self.t);
        // Zeroed: every handle is null until a read fills it, so the reclaim below frees only
        // what the library allocated, whatever the reads covered.
        buf.clear();
        buf.resize(bytes.div_ceil(8), 0);
        let mut result = Ok(());
        let mut at = 0;
        for (r0, n) in runs(part) {
            result = self
                .select(cx, self.fspace, r0, n)
                .and_then(|()| self.select(cx, mspace.0, at, n))
                .and_then(|()| {
                    cx.call(
                        || format!("read rows {r0}..{} of `{}`", r0 + n, self.name),
                        // SAFETY: `buf` holds the extent of `mspace` in `t` (sized above),
                        // all the library writes: values and handles it allocates.
                        || unsafe {
                            h5d::H5Dread(
                                self.d,
                                self.t,
                                mspace.0,
                                self.fspace,
                                H5P_DEFAULT,
                                buf.as_mut_ptr().cast(),
                            )
                        },
                    )
                })
                .map(|_| ());
            if result.is_err() {
                break;
            }
            at += n;
        }
        select_all(mspace.0);
        if result.is_ok() {
            result = self.select(ocx, self.ospace, out_row, len).and_then(|()| {
                ocx.call(
                    || format!("write rows of `{}`", self.name),
                    // SAFETY: `buf` holds the extent of `mspace` in `t` as the reads left it:
                    // every handle null or allocated by the library.
                    || unsafe {
                        h5d::H5Dwrite(
                            self.od,
                            self.t,
                            mspace.0,
                            self.ospace,
                            H5P_DEFAULT,
                            buf.as_ptr().cast(),
                        )
                    },
                )
                .map(|_| ())
            });
        }
        // SAFETY: `buf` holds the extent of `mspace` (all selected) in `t`, every handle null
        // (zeroed above) or allocated by the reads, and nothing else has written it.
        locked(|| unsafe {
            #[allow(deprecated)]
            h5d::H5Dvlen_reclaim(self.t, mspace.0, H5P_DEFAULT, buf.as_mut_ptr().cast());
        });
        buf.fill(0);
        result
    }
}

/// `v` as bytes.
pub(in crate::hdf5) fn bytes_mut(v: &mut [u64]) -> &mut [u8] {
    // SAFETY: the same allocation, borrowed as long as `v`: `u8` needs no alignment, any bit
    // pattern is a valid `u8`, and `v.len() * 8` bytes are exactly `v`'s.
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr().cast::<u8>(), v.len() * 8) }
}

/// Asks the kernel to start reading `len` bytes at `offset` of `file` (advisory).
pub(in crate::hdf5) fn will_need(file: &std::fs::File, offset: u64, len: u64) {
    // SAFETY: passes a descriptor `file` keeps open and two numbers; no memory of ours.
    unsafe {
        libc::posix_fadvise(
            file.as_raw_fd(),
            offset as libc::off_t,
            len as libc::off_t,
            libc::POSIX_FADV_WILLNEED,
        );
    }
}
