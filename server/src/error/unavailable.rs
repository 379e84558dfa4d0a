//! What this server cannot do now, for a reason of its own making (no usable state
//! directory, no annotation store): the call fails as UNAVAILABLE, naming the reason and
//! what to do about it.

use std::path::PathBuf;
use std::sync::Arc;

use crate::rois::RoiError;
use crate::state_dir::StateDirError;

/// A call this server cannot answer now; it travels as UNAVAILABLE.
#[derive(Clone, Debug, thiserror::Error)]
pub enum Unavailable {
    /// The server keeps no ROI annotations.
    #[error("ROI annotations are unavailable: {0}")]
    Annotations(#[source] Arc<NoAnnotations>),
    /// A write to the uploads of a server without a usable state directory.
    #[error(
        "{call} refused: this server has no usable state directory to keep uploads in \
         (see its log; choose one with --state-dir DIR)"
    )]
    NoStateDir {
        /// The refused call.
        call: String,
    },
}

/// Why a server keeps no ROI annotations (found when it starts).
#[derive(Debug, thiserror::Error)]
pub enum NoAnnotations {
    /// The operator turned annotations off.
    #[error(
        "annotations are turned off on this server (--annotations=false, \
         TESSERA_ANNOTATIONS=false or annotations = false in its config file)"
    )]
    Off,
    /// The server was made without a state directory (no daemon opened one).
    #[error("this server has no state directory to keep annotations in")]
    NoStateDir,
    /// Another server holds the state directory.
    #[error(
        "the state directory {} is held by another server; give this one its own with \
         --state-dir DIR (or TESSERA_STATE_DIR)",
        .dir.display()
    )]
    StateDirHeld {
        /// The state directory.
        dir: PathBuf,
    },
    /// The state directory's `annotations` part cannot be made.
    #[error(transparent)]
    Part(StateDirError),
    /// The annotation store cannot be opened.
    #[error(transparent)]
    Open(RoiError),
}
