//! Stand-ins for the entry points in a build without the `hdf5` feature: the same signatures,
//! each failing with [`Hdf5Error::NotBuilt`], so that callers need no `cfg` of their own and a
//! user who asks for HDF5 is told which build to use instead of meeting a link error.

use std::path::Path;

use super::{Containers, Hdf5Error, Result};
use metfs_tier::pacer::Pacer;

fn not_built<T>(what: &str) -> Result<T> {
    Err(Hdf5Error::NotBuilt { what: what.into() })
}

/// See the `hdf5`-feature version: here it always fails with [`Hdf5Error::NotBuilt`].
pub fn open_containers(
    _root: &Path,
    _files: &[String],
    _datasets: Option<&[String]>,
    _label_dataset: Option<&str>,
) -> Result<Containers> {
    not_built("HDF5 container mode")
}

/// See the `hdf5`-feature version: here it always fails with [`Hdf5Error::NotBuilt`].
pub fn read_scalar_labels(
    _root: &Path,
    _paths: impl Iterator<Item = String>,
    _name: &str,
) -> Result<Vec<String>> {
    not_built("HDF5 labels")
}

/// See the `hdf5`-feature version: here it always fails with [`Hdf5Error::NotBuilt`]. (No
/// [`Containers`] can exist in this build, so it is never reached.)
pub fn stage_rows(
    _c: &Containers,
    _file: usize,
    _rows: &[u64],
    _out: &Path,
    _pacer: &Pacer,
) -> Result<u64> {
    not_built("HDF5 container mode")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_entry_point_names_the_feature() {
        let root = Path::new("/nonexistent");
        let e = open_containers(root, &["a.h5".into()], None, None).unwrap_err();
        assert!(
            e.to_string().contains("built without the `hdf5` feature"),
            "{e}"
        );
        let e = read_scalar_labels(root, ["a.h5".to_string()].into_iter(), "label").unwrap_err();
        assert!(
            e.to_string().contains("built without the `hdf5` feature"),
            "{e}"
        );
        assert!(e.to_string().starts_with("HDF5 labels"), "{e}");
    }
}
