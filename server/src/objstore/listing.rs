//! What a listing of a prefix holds, as sources: `.npy` objects, and Zarr arrays (a key
//! ending in `.zarray`, or a `zarr.json` that may be an array; whether it is one is read at
//! open). Pure: no store is asked. Each source gets its id and its content version from
//! the listing alone (ETag, last-modified and size of its objects).

use object_store::ObjectMeta;

use crate::content_version::FileVersion;
use crate::objstore::address::StoreAddress;

/// One source a listing holds.
#[derive(Clone, Debug, PartialEq)]
pub enum Found {
    /// A `.npy` object.
    Npy {
        /// Its listing entry (key, size, ETag).
        meta: ObjectMeta,
        /// Its content version.
        version: FileVersion,
    },
    /// A Zarr array's or group's root (the key prefix of its objects, without the
    /// trailing `/`).
    Zarr {
        /// The root (`""`: the bucket's root).
        root: String,
        /// Which metadata document it has.
        node: ZarrNode,
        /// Its content version: every object under the root.
        version: FileVersion,
    },
}

/// The metadata document a Zarr root holds, so what it may be.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum ZarrNode {
    /// `.zarray`: a Zarr v2 array.
    V2Array,
    /// `.zgroup` or `.zattrs` without `.zarray`: a Zarr v2 group (an OME-Zarr 0.4 image
    /// when its `.zattrs` has `multiscales`).
    V2Group,
    /// `zarr.json`: a Zarr v3 array or group (an OME-Zarr 0.5 image when its attributes
    /// have `ome`).
    V3,
}

impl Found {
    /// The key (a `.npy` object's) or the root (a Zarr array's).
    pub fn key(&self) -> &str {
        match self {
            Found::Npy { meta, .. } => meta.location.as_ref(),
            Found::Zarr { root, .. } => root,
        }
    }

    /// Its content version.
    pub fn version(&self) -> FileVersion {
        match self {
            Found::Npy { version, .. } | Found::Zarr { version, .. } => *version,
        }
    }
}

/// The sources `objects` (a listing) hold, in key order: every `.npy` object
/// outside Zarr arrays, and every Zarr array.
pub fn classify(objects: &[ObjectMeta]) -> Vec<Found> {
    let mut sorted: Vec<&ObjectMeta> = objects.iter().collect();
    sorted.sort_by(|a, b| a.location.as_ref().cmp(b.location.as_ref()));
    let mut roots: Vec<(String, ZarrNode)> = Vec::new();
    for meta in &sorted {
        let key = meta.location.as_ref();
        let (dir, name) = key.rsplit_once('/').unwrap_or(("", key));
        let node = match name {
            ".zarray" => ZarrNode::V2Array,
            ".zgroup" | ".zattrs" => ZarrNode::V2Group,
            "zarr.json" => ZarrNode::V3,
            _ => continue,
        };
        roots.push((dir.to_string(), node));
    }
    // One root per directory, the first document in this order: `.zarray` (an array's
    // `.zattrs` is no group), `.zgroup`/`.zattrs`, `zarr.json`.
    roots.sort();
    roots.dedup_by(|a, b| a.0 == b.0);
    let under = |root: &str, key: &str| root.is_empty() || key.starts_with(&format!("{root}/"));
    let mut found: Vec<Found> = Vec::new();
    for meta in &sorted {
        let key = meta.location.as_ref();
        if key.to_ascii_lowercase().ends_with(".npy")
            && !roots
                .iter()
                .any(|(root, node)| *node != ZarrNode::V2Group && under(root, key))
        {
            found.push(Found::Npy {
                meta: (*meta).clone(),
                version: version_of(std::iter::once(*meta)),
            });
        }
    }
    for (root, node) in roots {
        let objects = sorted
            .iter()
            .copied()
            .filter(|m| under(&root, m.location.as_ref()));
        found.push(Found::Zarr {
            version: version_of(objects),
            root,
            node,
        });
    }
    found.sort_by(|a, b| a.key().cmp(b.key()));
    found
}

/// The source id a key or root asks for (made unique by the registry): its path below the
/// listed prefix (below the store's parent when the address names a `.zarr` store), `.npy`
/// and `.zarr` dropped from each segment, segments joined by `.` (`plates/p1.zarr/0` →
/// `plates.p1.0`); the bucket's name when nothing is left.
pub fn id_of(address: &StoreAddress, key: &str) -> String {
    let store = address.prefix.trim_end_matches('/');
    let relative = if !address.object && store.to_ascii_lowercase().ends_with(".zarr") {
        // An address naming one Zarr store: ids keep the store's name, as a store served
        // from disk does (`img.zarr` → `img`, its dataset `img.zarr/0` → `img.0`, the id an
        // OME-Zarr image's level is read under).
        match store.rsplit_once('/') {
            Some((parent, _)) => key
                .strip_prefix(parent)
                .and_then(|k| k.strip_prefix('/'))
                .unwrap_or(key),
            None => key,
        }
    } else {
        let relative = address.relative(key);
        if relative.is_empty() || relative == key && !address.prefix.is_empty() {
            key.rsplit('/').next().unwrap_or(key)
        } else {
            relative
        }
    };
    let parts: Vec<&str> = relative
        .split('/')
        .filter(|s| !s.is_empty())
        .map(|s| {
            let lower = s.to_ascii_lowercase();
            if lower.ends_with(".npy") || lower.ends_with(".zarr") {
                &s[..s.len() - if lower.ends_with(".npy") { 4 } else { 5 }]
            } else {
                s
            }
        })
        .filter(|s| !s.is_empty())
        .collect();
    if parts.is_empty() {
        address.bucket.clone()
    } else {
        parts.join(".")
    }
}

/// The `dev` word of an object-store source's version: no device number a `stat` returns
/// (the upstream sources' is `u64::MAX`).
pub const OBJECT_DEV: u64 = u64::MAX - 1;

/// The version of the objects `objects`: their total size, and a 128-bit digest of each
/// one's key, size, ETag, version id and last-modified time (in key order).
pub fn version_of<'a>(objects: impl Iterator<Item = &'a ObjectMeta>) -> FileVersion {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    let mut size: u64 = 0;
    for meta in objects {
        let key = meta.location.as_ref();
        let e_tag = meta.e_tag.as_deref().unwrap_or("");
        let version = meta.version.as_deref().unwrap_or("");
        for field in [key, e_tag, version] {
            ctx.update(&(field.len() as u64).to_be_bytes());
            ctx.update(field.as_bytes());
        }
        ctx.update(&meta.size.to_be_bytes());
        let modified = meta.last_modified.timestamp_nanos_opt().unwrap_or_default();
        ctx.update(&modified.to_be_bytes());
        size = size.saturating_add(meta.size);
    }
    let out = ctx.finish();
    let mut word = [0u8; 16];
    word.copy_from_slice(&out.as_ref()[..16]);
    let digest = u128::from_be_bytes(word);
    FileVersion {
        dev: OBJECT_DEV,
        ino: (digest >> 64) as u64,
        size,
        mtime_ns: digest as u64 as i64,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn meta(key: &str, size: u64, e_tag: &str) -> ObjectMeta {
        ObjectMeta {
            location: key.into(),
            last_modified: Default::default(),
            size,
            e_tag: Some(e_tag.to_string()),
            version: None,
        }
    }

    #[test]
    fn npy_objects_and_zarr_arrays_are_found_with_their_ids() {
        let address = StoreAddress::parse("s3://lab/exp/").unwrap();
        let listed = [
            meta("exp/a.npy", 200, "1"),
            meta("exp/notes.txt", 9, "2"),
            meta("exp/v2.zarr/.zarray", 300, "3"),
            meta("exp/v2.zarr/0.0", 40, "4"),
            meta("exp/img.zarr/zarr.json", 50, "5"),
            meta("exp/img.zarr/0/zarr.json", 60, "6"),
            meta("exp/img.zarr/0/c/0/0", 70, "7"),
            meta("exp/sub/B.NPY", 128, "8"),
        ];
        let found = classify(&listed);
        let keys: Vec<&str> = found.iter().map(Found::key).collect();
        assert_eq!(
            keys,
            [
                "exp/a.npy",
                "exp/img.zarr",
                "exp/img.zarr/0",
                "exp/sub/B.NPY",
                "exp/v2.zarr"
            ]
        );
        let ids: Vec<String> = keys.iter().map(|k| id_of(&address, k)).collect();
        assert_eq!(ids, ["a", "img", "img.0", "sub.B", "v2"]);
        match &found[4] {
            Found::Zarr { node, version, .. } => {
                assert_eq!(*node, ZarrNode::V2Array);
                assert_eq!(version.size, 340);
                assert_eq!(version.dev, OBJECT_DEV);
            }
            other => panic!("{other:?}"),
        }
        // An address naming one store or one object: its own name is the id.
        let store = StoreAddress::parse("s3://lab/exp/v2.zarr").unwrap();
        assert_eq!(id_of(&store, "exp/v2.zarr"), "v2");
        assert_eq!(id_of(&store, "exp/v2.zarr/0"), "v2.0");
        let top = StoreAddress::parse("s3://lab/img.zarr/").unwrap();
        assert_eq!(id_of(&top, "img.zarr"), "img");
        assert_eq!(id_of(&top, "img.zarr/a/1"), "img.a.1");
        let one = StoreAddress::parse("s3://lab/exp/a.npy").unwrap();
        assert_eq!(id_of(&one, "exp/a.npy"), "a");
    }

    #[test]
    fn a_v2_group_is_a_root_of_its_own_and_an_arrays_attributes_are_not() {
        let listed = [
            meta("ome.zarr/.zattrs", 900, "1"),
            meta("ome.zarr/.zgroup", 20, "2"),
            meta("ome.zarr/0/.zarray", 300, "3"),
            meta("ome.zarr/0/.zattrs", 30, "4"),
            meta("ome.zarr/0/0.0.0", 40, "5"),
            meta("ome.zarr/notes.npy", 128, "6"),
        ];
        let found = classify(&listed);
        let nodes: Vec<(&str, Option<ZarrNode>)> = found
            .iter()
            .map(|f| match f {
                Found::Zarr { root, node, .. } => (root.as_str(), Some(*node)),
                Found::Npy { .. } => (f.key(), None),
            })
            .collect();
        assert_eq!(
            nodes,
            [
                ("ome.zarr", Some(ZarrNode::V2Group)),
                ("ome.zarr/0", Some(ZarrNode::V2Array)),
                ("ome.zarr/notes.npy", None),
            ]
        );
        // The image's version covers its datasets' objects.
        assert_eq!(found[0].version().size, 1418);
    }

    #[test]
    fn a_replaced_object_changes_the_version_of_what_holds_it() {
        let before = [meta("s.zarr/.zarray", 10, "a"), meta("s.zarr/0", 5, "b")];
        let after = [meta("s.zarr/.zarray", 10, "a"), meta("s.zarr/0", 5, "c")];
        let (one, two) = (classify(&before), classify(&after));
        assert_ne!(one[0].version(), two[0].version());
        assert_eq!(one[0].version(), classify(&before)[0].version());
        let npy = [meta("x.npy", 10, "a")];
        let replaced = [meta("x.npy", 10, "b")];
        assert_ne!(
            classify(&npy)[0].version(),
            classify(&replaced)[0].version()
        );
    }
}
