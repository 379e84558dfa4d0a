//! Sources: the files Tessera serves and the registry of them.
pub mod npy;
pub mod registry;
pub mod watch;
