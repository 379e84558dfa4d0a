//! The formats the registry serves: each one a [`Format`] in [`FORMATS`], found by its file
//! name's extension. Adding a format is one module implementing
//! [`Source`](super::Source) and one line here (ARCHITECTURE.md, "Adding a format").

use std::path::Path;
use std::sync::Arc;

use super::Source;
use super::npy::{self, Limits, Placement};

/// Opens the file at a path as a source, or refuses it with the reason clients see.
pub type Opener = fn(&Path, &Limits, Option<Placement>) -> Result<Arc<dyn Source>, String>;

/// One format the registry serves.
#[derive(Clone, Copy, Debug)]
pub struct Format {
    /// The file name extension it claims, without the dot.
    pub extension: &'static str,
    /// Opens a file of the format: header checked, judged by the placement first.
    pub open: Opener,
}

/// The format a file given by name is opened with when no format claims its extension:
/// `.npy`, whose header check refuses what is not one (as before formats were registered).
const DEFAULT: Format = Format {
    extension: "npy",
    open: npy::open_source,
};

/// Every format served from files, tried by extension.
pub const FORMATS: &[Format] = &[DEFAULT];

/// The format that claims `path`, by its extension.
pub fn format_of(path: &Path) -> Option<&'static Format> {
    let extension = path.extension()?;
    FORMATS.iter().find(|f| extension == f.extension)
}

/// Whether a file at `path` is one the registry serves (its extension is a format's).
pub fn is_served(path: &Path) -> bool {
    format_of(path).is_some()
}

/// Opens `path` with the format that claims it (a file given by name that none claims:
/// the default, `.npy`).
pub fn open(
    path: &Path,
    limits: &Limits,
    place: Option<Placement>,
) -> Result<Arc<dyn Source>, String> {
    let format = format_of(path).unwrap_or(&DEFAULT);
    (format.open)(path, limits, place)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_format_is_found_by_its_extension_only() {
        assert_eq!(
            format_of(Path::new("/d/cells.npy")).map(|f| f.extension),
            Some("npy")
        );
        assert!(is_served(Path::new("x.npy")));
        assert!(!is_served(Path::new("x.npy.json")));
        assert!(!is_served(Path::new("npy")));
        assert!(!is_served(Path::new("x.NPY")));
    }
}
