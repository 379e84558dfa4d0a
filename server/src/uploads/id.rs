//! The names of uploaded tensors: `add_tensor` takes `cache://<source_id>/@fields/<name>`
//! or `zarr://<source_id>/@fields/<name>` (the scheme is the store format, nothing else) and
//! answers (and is then addressed by) `<source_id>/@fields/<name>`; a label set of a served
//! tensor is `zarr://<array_id>/@labels/<name>`, answered as `<array_id>/@labels/<name>`.

use super::record::StoreFormat;

/// The marked segment every uploaded tensor's id carries.
pub const FIELDS_SEGMENT: &str = "@fields";

/// The marked segment of a label set's id, between its image's id and its name.
const LABELS_MARK: &str = "/@labels/";

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
    /// For a label set, the array id of the image it labels.
    pub labels_of: Option<String>,
}

impl NewId {
    /// The array id the tensor is answered and addressed with.
    pub fn array_id(&self) -> String {
        match &self.labels_of {
            Some(image) => format!("{image}{LABELS_MARK}{}", self.name),
            None => format!("{}/{FIELDS_SEGMENT}/{}", self.source_id, self.name),
        }
    }
}

/// Whether `array_id` names an uploaded tensor (`<source_id>/@fields/<name>`, or a label
/// set `<array_id>/@labels/<name>`).
pub fn is_upload_id(array_id: &str) -> bool {
    array_id.contains(LABELS_MARK)
        || array_id
            .split_once('/')
            .is_some_and(|(_, rest)| rest.starts_with("@fields/"))
}

/// Whether `array_id` names a label set (`<array_id>/@labels/<name>`).
pub fn is_label_set(array_id: &str) -> bool {
    array_id.contains(LABELS_MARK)
}

/// The last segment of an upload's array id: its name.
pub fn name_of(array_id: &str) -> &str {
    array_id.rsplit_once('/').map_or(array_id, |(_, name)| name)
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
                "'{id}': the store format '{scheme}://' is not available ('{scheme}' is not a \
                 store format); {grammar}"
            ));
        }
    };
    if let Some((image, name)) = rest.rsplit_once(LABELS_MARK) {
        return parse_label_set(id, image, name, format);
    }
    let mut parts = rest.splitn(3, '/');
    let (Some(source_id), Some(segment), Some(name)) = (parts.next(), parts.next(), parts.next())
    else {
        return Err(format!("'{id}' names no tensor to add: {grammar}"));
    };
    if segment != FIELDS_SEGMENT || source_id.is_empty() {
        return Err(format!("'{id}' names no tensor to add: {grammar}"));
    }
    check_name(id, name)?;
    Ok(NewId {
        source_id: source_id.to_string(),
        name: name.to_string(),
        format,
        labels_of: None,
    })
}

/// A label set `<image>/@labels/<name>`: NGFF, so `zarr://` only; of an image that is not a
/// label set itself.
fn parse_label_set(
    id: &str,
    image: &str,
    name: &str,
    format: StoreFormat,
) -> Result<NewId, String> {
    if format != StoreFormat::Zarr {
        return Err(format!(
            "'{id}': a label set is NGFF, so it takes 'zarr://<array_id>/@labels/<name>'"
        ));
    }
    let source_id = image.split('/').next().unwrap_or_default();
    if source_id.is_empty() || image.contains(LABELS_MARK) || image.ends_with("/@labels") {
        return Err(format!(
            "'{id}' names no label set to add: use 'zarr://<array_id>/@labels/<name>', where \
             <array_id> is a served tensor that is not a label set"
        ));
    }
    check_name(id, name)?;
    Ok(NewId {
        source_id: source_id.to_string(),
        name: name.to_string(),
        format,
        labels_of: Some(image.to_string()),
    })
}

fn check_name(id: &str, name: &str) -> Result<(), String> {
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
    if name.starts_with('.') {
        return Err(format!(
            "'{id}': a tensor name may not start with '.' (a hidden file where it is stored)"
        ));
    }
    let stem = name.split('.').next().unwrap_or_default();
    if is_device_name(stem) {
        return Err(format!(
            "'{id}': '{stem}' is a device name Windows refuses as a file name, whatever the \
             extension; choose another name"
        ));
    }
    Ok(())
}

/// `CON`, `PRN`, `AUX`, `NUL`, `COM1`-`COM9`, `LPT1`-`LPT9` in any case: names Windows
/// keeps for devices, so a store named so could not be copied there (biopb refuses them).
fn is_device_name(stem: &str) -> bool {
    let upper = stem.to_ascii_uppercase();
    matches!(upper.as_str(), "CON" | "PRN" | "AUX" | "NUL")
        || ((upper.starts_with("COM") || upper.starts_with("LPT"))
            && upper.len() == 4
            && upper.as_bytes()[3].is_ascii_digit()
            && upper.as_bytes()[3] != b'0')
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
        let set = parse_new("zarr://img/@fields/x/@labels/cells").ok();
        assert_eq!(
            set.as_ref().map(NewId::array_id).as_deref(),
            Some("img/@fields/x/@labels/cells")
        );
        assert_eq!(
            set.and_then(|s| s.labels_of).as_deref(),
            Some("img/@fields/x")
        );
        assert!(is_upload_id("img/@labels/cells"));
        assert!(is_label_set("img/@fields/x/@labels/cells"));
        assert!(!is_label_set("img/@fields/labels"));
        assert_eq!(name_of("img/@fields/x/@labels/cells"), "cells");
        let refused = |id: &str| parse_new(id).err().unwrap_or_default();
        assert!(refused("cache://img/@labels/cells").contains("a label set is NGFF"));
        assert!(refused("zarr://img/@labels/a/@labels/b").contains("no label set"));
        assert!(refused("zarr://img/@labels/a/b").contains("tensor name"));
        assert!(refused("s3://img/@fields/x").contains("'s3://'"));
        assert!(refused("scratch/@fields/x").contains("names no tensor"));
        assert!(refused("cache://scratch/x").contains("names no tensor"));
        assert!(refused("cache://scratch/@fields/a/b").contains("tensor name"));
        assert!(refused("cache://scratch/@fields/..").contains("tensor name"));
        assert!(refused("s3://img/@fields/x").contains("'s3' is not a store format"));
    }

    #[test]
    fn names_biopb_refuses_are_refused() {
        let refused = |id: &str| parse_new(id).err().unwrap_or_default();
        assert!(refused("cache://scratch/@fields/.hidden").contains("may not start with '.'"));
        for device in ["CON", "con", "Nul.v2", "COM1", "lpt9.zarr", "AUX"] {
            let why = refused(&format!("zarr://scratch/@fields/{device}"));
            assert!(why.contains("device name"), "{device}: {why}");
        }
        for fine in ["CONS", "COM0", "COM10", "nuclei.v2", "a.b"] {
            assert!(
                parse_new(&format!("cache://scratch/@fields/{fine}")).is_ok(),
                "{fine}"
            );
        }
    }
}
