//! Labels: the scalar label of each per-sample file, and the label dataset of a container.

use std::ffi::CStr;
use std::os::raw::{c_char, c_void};
use std::path::Path;

use hdf5_sys::h5d::{self};
use hdf5_sys::h5i::hid_t;
use hdf5_sys::h5p::H5P_DEFAULT;
use hdf5_sys::h5s::{H5S_seloper_t, H5S_ALL};
use hdf5_sys::h5t::{H5T_class_t, H5T_sign_t, H5T_str_t};
use hdf5_sys::{h5a, h5i, h5o, h5s, h5t};

use super::ffi::{
    cstring, describe_type, link_exists, locked, open_dataset, open_file, simple_space, space_dims,
    Cx,
};
use super::*;

/// Reads `n` values of file type `t` through `read(mem_type, buf)` and renders each as a label:
/// integers and floats in decimal, strings as text, enum values (h5py booleans included) by
/// member name. `Err(reason)` for other types.
pub(super) fn values_to_labels(
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

pub(super) fn read_scalar_label(path: &Path, rel: &str, name: &str) -> Result<String> {
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

/// Reads the 1-D label dataset `name` (length `n`) in blocks, interning labels as it goes so
/// that ten million rows cost four bytes each.
pub(super) fn read_label_dataset(
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
