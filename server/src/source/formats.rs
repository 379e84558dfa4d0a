//! The formats the registry serves: each one a [`Format`] in [`FORMATS`], which claims a
//! file or directory by its name or its content. Adding a format is one module implementing
//! [`Source`](super::Source) and one line here (ARCHITECTURE.md, "Adding a format").

use std::path::Path;
use std::sync::Arc;

use super::Source;
use super::npy::{self, Limits, Placement};
use super::{tiff, zarr};

/// Opens the file or directory at a path as a source, or refuses it with the reason clients
/// see.
pub type Opener = fn(&Path, &Limits, Option<Placement>) -> Result<Arc<dyn Source>, String>;

/// One format the registry serves.
#[derive(Clone, Copy, Debug)]
pub struct Format {
    /// The extension an id drops (`cells.npy` → `cells`, `image.zarr` → `image`), no dot.
    pub extension: &'static str,
    /// Whether the format claims the file (`false`) or directory (`true`) at a path.
    pub claims: fn(&Path, bool) -> bool,
    /// Opens what it claimed: header or metadata checked, judged by the placement first.
    pub open: Opener,
}

/// The format a file given by name is opened with when no format claims it: `.npy`, whose
/// header check refuses what is not one (as before formats were registered).
const DEFAULT: Format = Format {
    extension: "npy",
    claims: |path, is_dir| !is_dir && path.extension().is_some_and(|e| e == "npy"),
    open: npy::open_source,
};

/// Zarr arrays and OME-Zarr images (directories).
const ZARR: Format = Format {
    extension: "zarr",
    claims: |path, is_dir| is_dir && zarr::claims(path),
    open: zarr::open_source,
};

/// TIFF, BigTIFF and OME-TIFF files (`.tif`, `.tiff`; an id drops the last extension).
const TIF: Format = Format {
    extension: "tif",
    claims: |path, is_dir| !is_dir && tiff::claims(path),
    open: tiff::open_source,
};

/// The other spelling of [`TIF`]'s extension, so that an id drops it too.
const TIFF: Format = Format {
    extension: "tiff",
    claims: |path, is_dir| !is_dir && tiff::claims(path),
    open: tiff::open_source,
};

/// Image formats users keep beside their arrays that this server does not read yet: claimed
/// by extension so that a served folder lists them as refused, by name, instead of passing
/// over them in silence.
const NOT_READ: &[Format] = &[
    not_read("czi"),
    not_read("nd2"),
    not_read("lif"),
    not_read("h5"),
];

/// A format claimed by extension and refused with what it is.
const fn not_read(extension: &'static str) -> Format {
    Format {
        extension,
        claims: |path, is_dir| !is_dir && is_not_read(path),
        open: |path, _, _| Err(not_read_reason(path)),
    }
}

fn is_not_read(path: &Path) -> bool {
    path.extension()
        .is_some_and(|e| NOT_READ.iter().any(|f| e.eq_ignore_ascii_case(f.extension)))
}

/// The refusal of a file of a format this server does not read.
fn not_read_reason(path: &Path) -> String {
    let extension = path
        .extension()
        .map(|e| e.to_string_lossy().to_lowercase())
        .unwrap_or_default();
    let what = match extension.as_str() {
        "czi" => "a Zeiss CZI file",
        "nd2" => "a Nikon ND2 file",
        "lif" => "a Leica LIF file",
        _ => "an HDF5 file",
    };
    format!(
        "{}: {what}, a format this server does not read (it serves .npy files, Zarr/OME-Zarr stores and TIFF/OME-TIFF files); convert it, e.g. to OME-Zarr",
        path.display()
    )
}

/// Every format served (or refused by name), tried in order.
pub const FORMATS: &[Format] = &[
    DEFAULT,
    ZARR,
    TIF,
    TIFF,
    NOT_READ[0],
    NOT_READ[1],
    NOT_READ[2],
    NOT_READ[3],
];

/// The format that claims `path` (a directory when `is_dir`).
pub fn format_of(path: &Path, is_dir: bool) -> Option<&'static Format> {
    FORMATS.iter().find(|f| (f.claims)(path, is_dir))
}

/// Whether the file or directory at `path` is one the registry serves.
pub fn is_served(path: &Path, is_dir: bool) -> bool {
    format_of(path, is_dir).is_some()
}

/// Whether a directory's members are walked into after it is claimed: a Zarr group's are
/// (an OME-Zarr image's datasets are served under their own ids too); an array's chunks are
/// not.
pub fn walks_into(path: &Path) -> bool {
    zarr::is_group(path)
}

/// The id of a path component without the extension of a format (`cells.npy` → `cells`).
pub fn strip_extension(component: &str) -> &str {
    FORMATS
        .iter()
        .find_map(|f| {
            component
                .strip_suffix(f.extension)
                .and_then(|rest| rest.strip_suffix('.'))
                .filter(|rest| !rest.is_empty())
        })
        .unwrap_or(component)
}

/// Opens `path` with the format that claims it (a file given by name that none claims:
/// the default, `.npy`).
pub fn open(
    path: &Path,
    limits: &Limits,
    place: Option<Placement>,
) -> Result<Arc<dyn Source>, String> {
    let format = format_of(path, path.is_dir()).unwrap_or(&DEFAULT);
    (format.open)(path, limits, place)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_file_format_is_found_by_its_extension_only() {
        assert_eq!(
            format_of(Path::new("/d/cells.npy"), false).map(|f| f.extension),
            Some("npy")
        );
        assert!(is_served(Path::new("x.npy"), false));
        assert!(!is_served(Path::new("x.npy"), true));
        assert!(!is_served(Path::new("x.npy.json"), false));
        assert!(!is_served(Path::new("npy"), false));
        assert!(!is_served(Path::new("x.NPY"), false));
        assert_eq!(strip_extension("cells.npy"), "cells");
        assert_eq!(strip_extension("image.zarr"), "image");
        assert_eq!(strip_extension(".zarr"), ".zarr");
        let tiff = Path::new("/d/stack.TIF");
        assert_eq!(format_of(tiff, false).map(|f| f.extension), Some("tif"));
        assert_eq!(strip_extension("stack.tiff"), "stack");
        let czi = Path::new("/d/scan.czi");
        let refusal = open(czi, &Limits::default(), None).unwrap_err();
        assert!(
            refusal.contains("a Zeiss CZI file, a format this server does not read"),
            "{refusal}"
        );
    }
}
