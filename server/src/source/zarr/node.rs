//! What a directory is to Zarr, read from its metadata documents alone (no chunk is read):
//! an array, a group (an OME-Zarr image when it has `multiscales`), or a `.zarr` directory
//! with no metadata. Also the checks made before zarrs opens an array, so a store with a
//! codec or dtype the server does not read is refused by name.

use std::path::Path;

use serde_json::Value;

use super::error::ZarrError;

/// A directory's place in a Zarr hierarchy.
#[derive(Debug)]
pub enum Node {
    /// An array (`.zarray`, or `zarr.json` with `node_type: array`).
    Array,
    /// A group; `multiscales` is the OME-Zarr image metadata when it has any.
    Group {
        /// The first `multiscales` entry of an OME-Zarr image (NGFF 0.4 `.zattrs` or 0.5
        /// `zarr.json` `attributes.ome`), with the `omero` block beside it.
        image: Option<ImageMeta>,
    },
    /// A directory named `*.zarr` without metadata, or metadata that is not JSON: claimed so
    /// that it is refused by name.
    Broken(String),
}

/// An OME-Zarr image's own metadata.
#[derive(Clone, Debug)]
pub struct ImageMeta {
    /// The NGFF version it states (`"0.4"`, `"0.5"`; empty: none stated).
    pub version: String,
    /// The first entry of `multiscales`.
    pub multiscales: Value,
    /// The `omero` block (channel names and rendering), when present.
    pub omero: Option<Value>,
}

/// What the directory at `dir` is, or `None` when it is no part of a Zarr hierarchy.
pub fn node_at(dir: &Path) -> Option<Node> {
    if dir.join(".zarray").is_file() {
        return Some(Node::Array);
    }
    let v3 = dir.join("zarr.json");
    if v3.is_file() {
        return Some(match read_json(&v3) {
            Err(err) => Node::Broken(err.to_string()),
            Ok(doc) if doc.get("node_type").and_then(Value::as_str) == Some("group") => {
                let ome = doc.pointer("/attributes/ome");
                Node::Group {
                    image: ome.and_then(image_meta),
                }
            }
            Ok(_) => Node::Array,
        });
    }
    let attrs = dir.join(".zattrs");
    if dir.join(".zgroup").is_file() || attrs.is_file() {
        let image = read_json(&attrs).ok().as_ref().and_then(image_meta);
        return Some(Node::Group { image });
    }
    let named = dir
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("zarr"));
    named.then(|| {
        Node::Broken(
            ZarrError::NoMetadata {
                path: dir.to_path_buf(),
            }
            .to_string(),
        )
    })
}

/// The image metadata of a group whose metadata document is `doc`: its `.zattrs` (Zarr v2,
/// NGFF 0.4) or its `zarr.json` (v3, NGFF 0.5 `attributes.ome`); `None`: not an image.
pub fn image_of_group(v2: bool, doc: &Value) -> Option<ImageMeta> {
    if v2 {
        image_meta(doc)
    } else {
        doc.pointer("/attributes/ome").and_then(image_meta)
    }
}

fn image_meta(attrs: &Value) -> Option<ImageMeta> {
    let first = attrs.get("multiscales")?.as_array()?.first()?.clone();
    let version = attrs
        .get("version")
        .or_else(|| first.get("version"))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    Some(ImageMeta {
        version,
        multiscales: first,
        omero: attrs.get("omero").cloned(),
    })
}

/// Reads a JSON metadata document.
pub fn read_json(path: &Path) -> Result<Value, ZarrError> {
    let bytes = std::fs::read(path).map_err(|source| ZarrError::Io {
        path: path.to_path_buf(),
        what: "read",
        source,
    })?;
    serde_json::from_slice(&bytes).map_err(|e| ZarrError::Metadata {
        path: path.to_path_buf(),
        why: e.to_string(),
    })
}

/// The compressors and filters of Zarr v2 the server decodes.
const V2_CODECS: &[&str] = &["blosc", "zstd", "gzip", "zlib", "crc32c"];

/// The codecs of Zarr v3 the server decodes.
const V3_CODECS: &[&str] = &[
    "bytes",
    "endian",
    "transpose",
    "blosc",
    "zstd",
    "gzip",
    "crc32c",
    "sharding_indexed",
    "numcodecs.zlib",
    "numcodecs.crc32c",
];

/// Refuses, before zarrs is asked, an array at `dir` whose codec or dtype is not served.
pub fn check_array(dir: &Path) -> Result<(), ZarrError> {
    let v2 = dir.join(".zarray");
    if v2.is_file() {
        check_metadata(true, &read_json(&v2)?, dir)
    } else {
        check_metadata(false, &read_json(&dir.join("zarr.json"))?, dir)
    }
}

/// Refuses an array whose metadata document `doc` (`.zarray` when `v2`, else `zarr.json`)
/// names a codec or dtype that is not served; `path` names the array in the refusal (a
/// directory, or an object-store URL).
pub fn check_metadata(v2: bool, doc: &Value, path: &Path) -> Result<(), ZarrError> {
    let dir = path;
    let (codecs, dtype) = if v2 {
        let mut codecs = Vec::new();
        if let Some(id) = doc.pointer("/compressor/id").and_then(Value::as_str) {
            codecs.push((id.to_string(), V2_CODECS));
        }
        for filter in doc
            .get("filters")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let id = filter.get("id").and_then(Value::as_str).unwrap_or("?");
            codecs.push((id.to_string(), V2_CODECS));
        }
        let dtype = match doc.get("dtype") {
            Some(Value::String(s)) => s.clone(),
            Some(other) => other.to_string(),
            None => String::new(),
        };
        (codecs, dtype)
    } else {
        let mut codecs = Vec::new();
        collect_v3_codecs(doc.get("codecs"), &mut codecs);
        let dtype = match doc.get("data_type") {
            Some(Value::String(s)) => s.clone(),
            Some(other) => other.to_string(),
            None => String::new(),
        };
        (codecs.into_iter().map(|c| (c, V3_CODECS)).collect(), dtype)
    };
    if let Some((codec, _)) = codecs
        .iter()
        .find(|(c, known)| !known.contains(&c.as_str()))
    {
        return Err(ZarrError::Codec {
            path: dir.to_path_buf(),
            codec: codec.clone(),
        });
    }
    if dtype_of_name(&dtype).is_none() && numpy_dtype(&dtype).is_none() {
        return Err(ZarrError::Dtype {
            path: dir.to_path_buf(),
            dtype,
        });
    }
    Ok(())
}

fn collect_v3_codecs(list: Option<&Value>, out: &mut Vec<String>) {
    for codec in list.and_then(Value::as_array).into_iter().flatten() {
        let name = match codec {
            Value::String(s) => s.clone(),
            other => other
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or("?")
                .to_string(),
        };
        out.push(name);
        collect_v3_codecs(codec.pointer("/configuration/codecs"), out);
        collect_v3_codecs(codec.pointer("/configuration/index_codecs"), out);
    }
}

/// The numpy dtype (native byte order: zarrs decodes to it) of a Zarr v3 data type name.
pub fn dtype_of_name(name: &str) -> Option<&'static str> {
    Some(match name {
        "bool" => "|b1",
        "int8" => "|i1",
        "uint8" => "|u1",
        "int16" => "<i2",
        "uint16" => "<u2",
        "int32" => "<i4",
        "uint32" => "<u4",
        "int64" => "<i8",
        "uint64" => "<u8",
        "float16" => "<f2",
        "float32" => "<f4",
        "float64" => "<f8",
        "complex64" => "<c8",
        "complex128" => "<c16",
        _ => return None,
    })
}

/// The native-order numpy dtype of a Zarr v2 dtype string (`">u2"` → `"<u2"`).
fn numpy_dtype(v2: &str) -> Option<&'static str> {
    let mut chars = v2.chars();
    let order = chars.next()?;
    if !matches!(order, '<' | '>' | '|' | '=') {
        return None;
    }
    let name = match chars.as_str() {
        "b1" => "bool",
        "i1" => "int8",
        "u1" => "uint8",
        "i2" => "int16",
        "u2" => "uint16",
        "i4" => "int32",
        "u4" => "uint32",
        "i8" => "int64",
        "u8" => "uint64",
        "f2" => "float16",
        "f4" => "float32",
        "f8" => "float64",
        "c8" => "complex64",
        "c16" => "complex128",
        _ => return None,
    };
    dtype_of_name(name)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn unknown_codecs_and_object_dtypes_are_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let write = |doc: &str| std::fs::write(dir.path().join(".zarray"), doc).unwrap();
        write(
            r#"{"zarr_format":2,"shape":[4],"chunks":[2],"dtype":">u2","compressor":{"id":"lz4"},"filters":null,"order":"C","fill_value":0}"#,
        );
        let err = check_array(dir.path()).unwrap_err().to_string();
        assert!(
            err.contains("codec 'lz4', which this server does not read"),
            "{err}"
        );
        write(
            r#"{"zarr_format":2,"shape":[4],"chunks":[2],"dtype":"|O","compressor":null,"filters":null,"order":"C","fill_value":0}"#,
        );
        let err = check_array(dir.path()).unwrap_err().to_string();
        assert!(err.contains("dtype '|O'"), "{err}");
        write(
            r#"{"zarr_format":2,"shape":[4],"chunks":[2],"dtype":">u2","compressor":{"id":"blosc"},"filters":null,"order":"F","fill_value":0}"#,
        );
        check_array(dir.path()).unwrap();
        assert!(matches!(node_at(dir.path()), Some(Node::Array)));
    }
}
