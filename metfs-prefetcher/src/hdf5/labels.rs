//! Labels: the scalar label of each per-sample file, and the label dataset of a container.

use std::path::Path;

use hdf5_sys::h5i::hid_t;
use hdf5_sys::h5p::H5P_DEFAULT;
use hdf5_sys::h5t::{H5T_class_t, H5T_sign_t, H5T_str_t};

use super::ffi::attrs::{attr_exists, attr_space, attr_type, open_attr};
use super::ffi::io::{read, read_vlen_strings, Obj};
use super::ffi::space::{select_hyperslab, simple_space, space_dims};
use super::ffi::types::{
    describe_type, enum_name, is_variable_str, native, type_class, type_copy, type_sign, type_size,
    type_strpad, Native,
};
use super::ffi::{
    cstring, dataset_space, dataset_type, is_dataset, link_exists, open_dataset, open_file, Cx,
};
use super::{Hdf5Error, Result};

/// Reads the `n` values of file type `t` that `obj` selects and renders each as a label:
/// integers and floats in decimal, strings as text, enum values (h5py booleans included) by
/// member name. `Err(reason)` for other types.
pub(super) fn values_to_labels(
    cx: Cx,
    what: &dyn Fn() -> String,
    obj: Obj,
    t: hid_t,
    n: usize,
) -> Result<std::result::Result<Vec<String>, String>> {
    let (class, size, sign) = (type_class(t), type_size(t), type_sign(t));
    Ok(Ok(match class {
        H5T_class_t::H5T_INTEGER if sign == H5T_sign_t::H5T_SGN_NONE => {
            let mut v = vec![0u64; n];
            read(cx, what, obj, native(Native::U64), &mut v)?;
            v.iter().map(|x| x.to_string()).collect()
        }
        H5T_class_t::H5T_INTEGER => {
            let mut v = vec![0i64; n];
            read(cx, what, obj, native(Native::I64), &mut v)?;
            v.iter().map(|x| x.to_string()).collect()
        }
        // A float32 label read as f64 would print as 0.10000000149011612.
        H5T_class_t::H5T_FLOAT if size <= 4 => {
            let mut v = vec![0f32; n];
            read(cx, what, obj, native(Native::F32), &mut v)?;
            v.iter().map(|x| x.to_string()).collect()
        }
        H5T_class_t::H5T_FLOAT => {
            let mut v = vec![0f64; n];
            read(cx, what, obj, native(Native::F64), &mut v)?;
            v.iter().map(|x| x.to_string()).collect()
        }
        H5T_class_t::H5T_STRING => {
            let mem = type_copy(cx, t)?;
            if is_variable_str(t) {
                read_vlen_strings(cx, what, obj, mem.0)?
            } else {
                let pad = type_strpad(t);
                let mut v = vec![0u8; n * size];
                read(cx, what, obj, mem.0, &mut v)?;
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
            let mem = type_copy(cx, t)?;
            let mut v = vec![0u8; n * size];
            read(cx, what, obj, mem.0, &mut v)?;
            let mut out = Vec::with_capacity(n);
            for val in v.chunks(size.max(1)) {
                out.push(enum_name(cx, t, val)?);
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
    let file = open_file(cx, path)?;
    let cname = cstring(cx, name)?;
    let trimmed = name.trim_matches('/');
    let as_dataset =
        !trimmed.is_empty() && link_exists(cx, file.0, trimmed)? && is_dataset(cx, file.0, &cname)?;
    let (obj, space, t, is_attr) = if as_dataset {
        let d = open_dataset(cx, file.0, name, H5P_DEFAULT)?;
        let s = dataset_space(cx, d.0)?;
        let t = dataset_type(cx, d.0)?;
        (d, s, t, false)
    } else {
        if !attr_exists(cx, file.0, &cname)? {
            return Err(bad(
                "no such dataset, nor attribute of the root group".to_string()
            ));
        }
        let a = open_attr(cx, file.0, &cname)?;
        let s = attr_space(cx, a.0)?;
        let t = attr_type(cx, a.0)?;
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
    let what = || format!("read `{name}`");
    let target = if is_attr {
        Obj::Attribute(obj.0)
    } else {
        Obj::Dataset {
            d: obj.0,
            mspace: None,
            fspace: None,
        }
    };
    match values_to_labels(cx, &what, target, t.0, 1)? {
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
    let t = dataset_type(cx, d.0)?;
    let fspace = dataset_space(cx, d.0)?;
    let mut out = Vec::with_capacity(n as usize);
    let mut start = 0;
    while start < n {
        let len = STEP.min(n - start);
        let mspace = simple_space(cx, &[len], None)?;
        select_hyperslab(
            cx,
            || "select labels".into(),
            fspace.0,
            &[start],
            &[len],
            None,
        )?;
        let what = || format!("read labels `{name}`");
        let target = Obj::Dataset {
            d: d.0,
            mspace: Some(mspace.0),
            fspace: Some(fspace.0),
        };
        let labels = values_to_labels(cx, &what, target, t.0, len as usize)?.map_err(|reason| {
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
