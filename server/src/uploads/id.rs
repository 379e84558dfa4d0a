//! The names of uploaded tensors: `add_tensor` takes `cache://<source_id>/@fields/<name>`
//! or `zarr://<source_id>/@fields/<name>` (the scheme is the store format, nothing else) and
//! answers (and is then addressed by) `<source_id>/@fields/<name>`.

use super::record::StoreFormat;

/// The marked segment every uploaded tensor's id carries.
pub const FIELDS_SEGMENT: &str = "@fields";

/// The source that takes results belonging to no served source; present whenever uploads
/// are.
pub const SCRATCH_SOURCE_ID: &str = "scratch";

/// Longest tensor name accepted.
const MAX_NAME_BYTES: usize = 255;

/// A parsed `add_tensor` id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewId {
    /// The source the tensor is added to.
    pub source_id: String,
    /// The tensor's name within it.
    pub name: String,
    /// How its bytes are kept, as the scheme said.
    pub format: StoreFormat,
}

impl NewId {
    /// The array id the tensor is answered and addressed with.
    pub fn array_id(&self) -> String {
        format!("{}/{FIELDS_SEGMENT}/{}", self.source_id, self.name)
    }
}

/// Whether `array_id` names an uploaded tensor (`<source_id>/@fields/<name>`).
pub fn is_upload_id(array_id: &str) -> bool {
    array_id
        .split_once('/')
        .is_some_and(|(_, rest)| rest.starts_with("@fields/"))
}

/// Parses an `add_tensor` id; the error says what is wrong and what is expected.
pub fn parse_new(id: &str) -> Result<NewId, String> {
    let grammar = "use 'cache://<source_id>/@fields/<name>' or 'zarr://<source_id>/@fields/<name>' \
                   (the 'scratch' source takes results that belong to no served source)";
    let Some((scheme, rest)) = id.split_once("://") else {
        return Err(format!("'{id}' names no tensor to add: {grammar}"));
    };
    let format = match scheme {
        "cache" => StoreFormat::Cache,
        "zarr" => StoreFormat::Zarr,
        _ => {
            return Err(format!(
                "'{id}': the store format '{scheme}://' is not available; {grammar}"
            ));
        }
    };
    let mut parts = rest.splitn(3, '/');
    let (Some(source_id), Some(segment), Some(name)) = (parts.next(), parts.next(), parts.next())
    else {
        return Err(format!("'{id}' names no tensor to add: {grammar}"));
    };
    if segment == "@labels" || name.contains("/@labels/") {
        return Err(format!(
            "'{id}': Zarr label sets ('zarr://<array_id>/@labels/<name>') are not available \
             yet; {grammar}"
        ));
    }
    if segment != FIELDS_SEGMENT || source_id.is_empty() {
        return Err(format!("'{id}' names no tensor to add: {grammar}"));
    }
    let name_ok = !name.is_empty()
        && name.len() <= MAX_NAME_BYTES
        && name != "."
        && name != ".."
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
    if !name_ok {
        return Err(format!(
            "'{id}': a tensor name is 1 to {MAX_NAME_BYTES} characters of letters, digits, \
             '.', '_' and '-'"
        ));
    }
    Ok(NewId {
        source_id: source_id.to_string(),
        name: name.to_string(),
        format,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_and_zarr_fields_parse_and_everything_else_is_refused_by_name() {
        let id = parse_new("cache://scratch/@fields/seg-1.v2").ok();
        assert_eq!(
            id.as_ref().map(NewId::array_id).as_deref(),
            Some("scratch/@fields/seg-1.v2")
        );
        assert!(is_upload_id("scratch/@fields/seg-1.v2"));
        assert!(!is_upload_id("scratch"));
        assert_eq!(id.map(|id| id.format), Some(StoreFormat::Cache));
        let zarr = parse_new("zarr://img/@fields/x").ok();
        assert_eq!(
            zarr.as_ref().map(NewId::array_id).as_deref(),
            Some("img/@fields/x")
        );
        assert_eq!(zarr.map(|id| id.format), Some(StoreFormat::Zarr));
        let refused = |id: &str| parse_new(id).err().unwrap_or_default();
        assert!(refused("zarr://img/@labels/cells").contains("not available yet"));
        assert!(refused("zarr://img/@fields/x/@labels/cells").contains("Zarr label sets"));
        assert!(refused("s3://img/@fields/x").contains("'s3://'"));
        assert!(refused("scratch/@fields/x").contains("names no tensor"));
        assert!(refused("cache://scratch/x").contains("names no tensor"));
        assert!(refused("cache://scratch/@fields/a/b").contains("tensor name"));
        assert!(refused("cache://scratch/@fields/..").contains("tensor name"));
    }
}
