//! A Zarr root the listing found, opened as what its metadata says: an array, an OME-Zarr
//! image (NGFF 0.4 `.zattrs` or 0.5 `zarr.json` `ome`) as one tensor whose datasets are
//! its native levels (the same [`OmeImage`] as a local image, its datasets read by zarrs
//! on the object store), or a plain group (no source: its arrays are sources of their own).

use std::path::Path;
use std::sync::Arc;

use serde_json::Value;

use crate::content_version::FileVersion;
use crate::objstore::client::Client;
use crate::objstore::error::ObjectStoreError;
use crate::objstore::listing::ZarrNode;
use crate::objstore::zarr::{ZarrObject, document, metadata_document};
use crate::source::Source;
use crate::source::npy::Limits;
use crate::source::zarr::{ImageMeta, OmeImage, image_of_group};

/// Opens the Zarr root `root` holding `node`, its version `version` (every object under
/// it); `Ok(None)`: a group that is no image. Blocking.
pub fn open_node(
    client: &Client,
    root: &str,
    node: ZarrNode,
    version: FileVersion,
    limits: &Limits,
) -> Result<Option<Arc<dyn Source>>, ObjectStoreError> {
    let image = match node {
        ZarrNode::V2Array => None,
        ZarrNode::V2Group => match document(client, root, ".zattrs") {
            Ok((_, attrs)) => match image_of_group(true, &attrs) {
                Some(meta) => Some(meta),
                None => return Ok(None),
            },
            // A group with `.zgroup` only: no attributes, no image.
            Err(ObjectStoreError::Missing { .. }) => return Ok(None),
            Err(err) => return Err(err),
        },
        ZarrNode::V3 => {
            let (key, doc) = metadata_document(client, root, false)?;
            if doc.get("node_type").and_then(Value::as_str) != Some("group") {
                let array = ZarrObject::open_with(client, root, false, key, &doc, version, limits)?;
                return Ok(Some(Arc::new(array)));
            }
            match image_of_group(false, &doc) {
                Some(meta) => Some(meta),
                None => return Ok(None),
            }
        }
    };
    match image {
        Some(meta) => {
            let v2 = node == ZarrNode::V2Group;
            open_image(client, root, v2, meta, version, limits).map(|i| Some(Arc::new(i) as _))
        }
        None => ZarrObject::open(client, root, true, version, limits)
            .map(|a| a.map(|a| Arc::new(a) as _)),
    }
}

/// The OME-Zarr image at `root` (Zarr v2 when `v2`), each dataset opened as an array of
/// the same Zarr format under the root; a dataset that is missing, a group, or not served
/// refuses the image by name.
fn open_image(
    client: &Client,
    root: &str,
    v2: bool,
    meta: ImageMeta,
    version: FileVersion,
    limits: &Limits,
) -> Result<OmeImage<ZarrObject>, ObjectStoreError> {
    let url = client.address().url_of(root);
    OmeImage::build(Path::new(&url), meta, |path| {
        let dataset = if root.is_empty() {
            path.to_string()
        } else {
            format!("{root}/{path}")
        };
        ZarrObject::open(client, &dataset, v2, version, limits)?.ok_or_else(|| {
            ObjectStoreError::Refused {
                url: url.clone(),
                why: format!("its dataset '{path}' is a group, not an array"),
            }
        })
    })
}
