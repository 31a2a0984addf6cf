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
//!
//! # Modules
//!
//! Everything but `containers` needs libhdf5 and is built only with the default `hdf5` cargo
//! feature; without it, `unavailable` stands in for the entry points and refuses every call.
//!
//! * `ffi` (a folder: `space`, `types`, `attrs`, `io`): the thin layer over the raw library,
//!   one safe wrapper per call, and the only module here with `unsafe` code (its module docs
//!   say why each kind of wrapper is sound).
//! * `labels`: per-sample scalar labels and a container's label dataset.
//! * `inspect`: [`open_containers`], which chooses row and side datasets.
//! * `containers`: [`Containers`], rows to sample ids and back.
//! * `stage`: [`stage_rows`], one staged file per container and mini-epoch.
//! * `source`: reading rows of a source dataset into a block buffer, with read-ahead hints.

use thiserror::Error;

/// Target size of one block of rows moved by one read and one write in [`stage_rows`], and of
/// the scratch buffer compressed sources are read through. Together they keep staging within
/// ~64 MiB of row buffers however large the mini-epoch.
pub const BLOCK_BYTES: usize = 32 << 20;

/// Side datasets (see the module docs) larger than this are left out of staged files: a copy of
/// them lands in every slot, and the budget does not count them.
pub const SIDE_LIMIT: u64 = 16 << 20;

/// Name of the dataset every staged container file gets: the source row of each output row.
pub const INDEX_DATASET: &str = "metfs_index";

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
    /// This build has no HDF5 support: the `hdf5` cargo feature (on by default) was left out,
    /// so libhdf5 is not linked. `what` names what was asked for.
    #[error("{what}: this metfs was built without the `hdf5` feature; rebuild with the default features to use HDF5")]
    NotBuilt {
        /// What needed HDF5 (`HDF5 container mode`, `HDF5 labels`).
        what: String,
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

mod containers;
#[cfg(feature = "hdf5")]
mod ffi;
#[cfg(feature = "hdf5")]
mod inspect;
#[cfg(feature = "hdf5")]
mod labels;
#[cfg(feature = "hdf5")]
mod source;
#[cfg(feature = "hdf5")]
mod stage;
#[cfg(all(test, feature = "hdf5"))]
mod tests;
#[cfg(not(feature = "hdf5"))]
mod unavailable;
#[cfg(not(feature = "hdf5"))]
pub use unavailable::{open_containers, read_scalar_labels, stage_rows};

/// True when this build links libhdf5 (the default `hdf5` cargo feature). Without it the types
/// here remain, so callers compile unchanged, and [`open_containers`], [`read_scalar_labels`]
/// and [`stage_rows`] fail with [`Hdf5Error::NotBuilt`].
pub const AVAILABLE: bool = cfg!(feature = "hdf5");

pub use containers::{ContainerFile, Containers, DatasetInfo};
#[cfg(feature = "hdf5")]
pub use inspect::open_containers;
#[cfg(feature = "hdf5")]
pub use labels::read_scalar_labels;
#[cfg(feature = "hdf5")]
pub use stage::stage_rows;
