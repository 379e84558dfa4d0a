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

/// Every format served from files, tried by extension.
pub const FORMATS: &[Format] = &[Format {
    extension: "npy",
    open: npy::open_source,
}];

/// The format that claims `path`, by its extension.
pub fn format_of(path: &Path) -> Option<&'static Format> {
    let extension = path.extension()?;
    FORMATS.iter().find(|f| extension == f.extension)
}

/// Whether a file at `path` is one the registry serves (its extension is a format's).
pub fn is_served(path: &Path) -> bool {
    format_of(path).is_some()
}

/// Opens `path` with the format that claims it.
pub fn open(
    path: &Path,
    limits: &Limits,
    place: Option<Placement>,
) -> Result<Arc<dyn Source>, String> {
    match format_of(path) {
        Some(format) => (format.open)(path, limits, place),
        None => Err(format!(
            "{}: no served format has its extension (served: {})",
            path.display(),
            FORMATS
                .iter()
                .map(|f| format!(".{}", f.extension))
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}
