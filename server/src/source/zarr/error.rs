//! Why a Zarr store was refused or one of its reads failed: each names the store and why.

use std::path::PathBuf;

/// A Zarr store refused at open, or a read of it that failed.
#[derive(Debug, thiserror::Error)]
pub enum ZarrError {
    /// The file system refused an operation on the store.
    #[error("{}: {what}: {source}", path.display())]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// What was being done.
        what: &'static str,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
    /// A metadata document is not JSON of the shape Zarr defines.
    #[error("{}: a Zarr store whose metadata is not valid: {why}", path.display())]
    Metadata {
        /// The metadata file.
        path: PathBuf,
        /// What is wrong with it.
        why: String,
    },
    /// A directory named like a store holds no Zarr metadata.
    #[error(
        "{}: a .zarr directory with no Zarr metadata (.zarray, .zgroup or zarr.json): not a Zarr store",
        path.display()
    )]
    NoMetadata {
        /// The directory.
        path: PathBuf,
    },
    /// The store uses a codec this server does not decode.
    #[error("{}: a Zarr store with codec '{codec}', which this server does not read", path.display())]
    Codec {
        /// The store.
        path: PathBuf,
        /// The codec's name as the metadata gives it.
        codec: String,
    },
    /// The store's data type is not one the server serves.
    #[error(
        "{}: a Zarr store of dtype '{dtype}', which is not supported: only booleans, integers, floats and complex numbers are served",
        path.display()
    )]
    Dtype {
        /// The store.
        path: PathBuf,
        /// The data type as the metadata gives it.
        dtype: String,
    },
    /// The store is larger than the configured limits allow.
    #[error(
        "{}: a Zarr store of shape {shape:?} holds {bytes} bytes, over the limit of {limit} bytes",
        path.display()
    )]
    TooLarge {
        /// The store.
        path: PathBuf,
        /// Its shape.
        shape: Vec<u64>,
        /// Its size in bytes (saturated).
        bytes: u64,
        /// The limit.
        limit: u64,
    },
    /// zarrs could not open the array (an invalid or unsupported part of its metadata).
    #[error("{}: a Zarr store this server cannot open: {source}", path.display())]
    Open {
        /// The store.
        path: PathBuf,
        /// zarrs' error.
        #[source]
        source: Box<zarrs::array::ArrayCreateError>,
    },
    /// An OME-Zarr image whose `multiscales` cannot be served.
    #[error("{}: an OME-Zarr image whose multiscales cannot be served: {why}", path.display())]
    Ome {
        /// The image group.
        path: PathBuf,
        /// What is wrong.
        why: String,
    },
    /// A region could not be read or decoded.
    #[error("{}: reading region {start:?}..{stop:?} failed: {source}", path.display())]
    Read {
        /// The store.
        path: PathBuf,
        /// The region's start.
        start: Vec<u64>,
        /// The region's stop.
        stop: Vec<u64>,
        /// zarrs' error.
        #[source]
        source: Box<zarrs::array::ArrayError>,
    },
    /// zarrs decoded something other than the region's fixed-size elements.
    #[error("{}: a decoded region is not what was asked for: {why}", path.display())]
    Decoded {
        /// The store.
        path: PathBuf,
        /// What differed.
        why: String,
    },
    /// A file of the store changed, appeared or vanished since the store was opened.
    #[error(
        "{}: the source changed since it was opened ({file} is not what it was): plan the read again",
        path.display()
    )]
    Changed {
        /// The store.
        path: PathBuf,
        /// The file that differs, relative to the store.
        file: String,
    },
}
