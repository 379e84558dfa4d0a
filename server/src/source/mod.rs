//! Sources: the files and stores Tessera serves ([`npy`], [`zarr`], [`tiff`]), the registry of them ([`registry`]), its
//! lifecycle ([`sources`]) and the state of full scans ([`scan`]); the watcher rescans them.
pub mod abstraction;
pub mod confine;
pub mod formats;
pub mod ids;
pub mod meta;
pub mod npy;
pub mod origin;
pub mod registry;
pub mod runtime;
pub mod scan;
pub mod sources;
pub mod tiff;
pub mod zarr;

pub use abstraction::{
    ByteRange, HeldChunk, HeldChunks, HeldLocation, Scaling, Source, SourceError, SourceErrorKind,
};
