//! Zarr stores (v2 and v3) and OME-Zarr images (NGFF 0.4 and 0.5) as sources, read through
//! the `zarrs` crate on its filesystem store (docs/decisions/0030).
//!
//! * A directory that is a Zarr **array** is a source of one tensor ([`ZarrArray`]).
//! * A **group** is walked into: its arrays are sources named by their path (the registry's
//!   id rule: `plate.zarr/a/b` → `plate.a.b`).
//! * A group with OME-Zarr `multiscales` is an **image** ([`OmeImage`]): one tensor whose
//!   datasets are the native levels of its pyramid; the datasets are also served under their
//!   own ids (`image.0`, `image.1`, …), as the group's arrays.
//! * A `.zarr` directory with no metadata, or with metadata that is not JSON, is claimed and
//!   refused by name, as is a store with a codec or dtype the server does not read.
//!
//! The grids fit the store ([`Source::native_chunk`]): a cell is whole chunks (or shards).
//! The content version is a snapshot of the store's tree (`version.rs`).

mod array;
mod error;
mod image;
mod node;
mod version;

use std::path::Path;
use std::sync::Arc;

pub use array::ZarrArray;
pub use error::ZarrError;
pub use image::{Dataset, OmeImage};
pub use version::tree_version;

use node::Node;
pub(crate) use node::{ImageMeta, check_metadata, dtype_of_name, image_of_group};

use super::Source;
use super::npy::{Limits, Placement};

/// Whether the directory at `path` is a Zarr source (an array, an OME-Zarr image, or a
/// `.zarr` directory refused by name).
pub fn claims(path: &Path) -> bool {
    matches!(
        node::node_at(path),
        Some(Node::Array | Node::Broken(_) | Node::Group { image: Some(_) })
    )
}

/// Whether the directory at `path` is a Zarr group, whose members are walked into.
pub fn is_group(path: &Path) -> bool {
    matches!(node::node_at(path), Some(Node::Group { .. }))
}

/// Opens the Zarr array or OME-Zarr image at `path` (the registry's opener), or refuses it
/// with the reason clients see.
pub fn open_source(
    path: &Path,
    limits: &Limits,
    place: Option<Placement>,
) -> Result<Arc<dyn Source>, String> {
    if let Some(place) = place {
        let dir =
            std::fs::File::open(path).map_err(|e| format!("{}: open: {e}", path.display()))?;
        place(&dir)?;
    }
    match node::node_at(path) {
        Some(Node::Array) => {
            let snapshot = Arc::new(version::Snapshot::take(path).map_err(|e| e.to_string())?);
            ZarrArray::open(path, snapshot, String::new(), limits)
                .map(|a| Arc::new(a) as Arc<dyn Source>)
                .map_err(|e| e.to_string())
        }
        Some(Node::Group { image: Some(meta) }) => OmeImage::open(path, meta, limits)
            .map(|i| Arc::new(i) as Arc<dyn Source>)
            .map_err(|e| e.to_string()),
        Some(Node::Broken(why)) => Err(why),
        Some(Node::Group { image: None }) | None => Err(ZarrError::NoMetadata {
            path: path.to_path_buf(),
        }
        .to_string()),
    }
}
