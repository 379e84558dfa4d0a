//! `tessera config check`: the effective configuration, printed as a config file.
//!
//! The resolved [`Settings`] have the config file's shape, so they are printed by
//! serializing them: the output can be saved and served as is, except for the token,
//! which is never printed.

use super::Settings;

/// What is printed instead of the token.
pub const REDACTED: &str = "<redacted>";

/// The effective configuration as TOML, token redacted.
pub fn render(settings: &Settings) -> String {
    let mut shown = settings.clone();
    if shown.listener.token.is_some() {
        shown.listener.token = Some(REDACTED.to_string());
    }
    toml::to_string(&shown).unwrap_or_else(|e| format!("# cannot render the configuration: {e}\n"))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::ops::config::ServeArgs;

    #[test]
    fn output_is_a_valid_config_file_without_the_token() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.toml");
        std::fs::write(
            &path,
            "token = \"s3cret-token-0123456789\"\nwatch = true\nmetrics_listen = \"127.0.0.1:9\"\n\
             [[source]]\npath = \"/data/a.npy\"\nid = \"alpha\"\ndim_labels = [\"y\", \"x\"]\n",
        )
        .unwrap();
        let config = Settings::resolve(ServeArgs {
            config: Some(path.clone()),
            ..Default::default()
        })
        .unwrap();
        let text = render(&config);
        assert!(!text.contains("s3cret"), "{text}");
        assert!(text.contains(REDACTED), "{text}");
        std::fs::write(&path, &text).unwrap();
        let reread = ServeArgs::load(&path).unwrap();
        let source = &reread.source[0];
        assert_eq!(source.id.as_deref(), Some("alpha"));
        assert_eq!(reread.sources.watch, Some(true));
        assert_eq!(
            reread.operations.metrics_listen,
            Some("127.0.0.1:9".parse().unwrap())
        );
    }

    #[test]
    fn what_is_printed_reads_back_to_the_same_settings() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.toml");
        std::fs::write(
            &path,
            "sources = [\"/d/plain\"]\nchunk_target = \"4MiB\"\nupload_max_ttl = \"90m\"\n\
             add_source_roots = [\"/r\"]\n[cache]\nkind = \"memory\"\nmax_bytes = \"3GiB\"\n\
             [tls]\ncert = \"/c.pem\"\nkey = \"/k.pem\"\n[pyramid]\nmethod = \"Area\"\n\
             [[source]]\npath = \"/d/a.npy\"\nphysical_scale = [0.5, 0.1]\n\
             physical_unit = \"um\"\nmetadata = { objective = \"60x\" }\n",
        )
        .unwrap();
        let resolve = |path: &std::path::Path| {
            Settings::resolve(ServeArgs {
                config: Some(path.to_path_buf()),
                ..Default::default()
            })
            .unwrap()
        };
        let first = resolve(&path);
        let printed = dir.path().join("printed.toml");
        std::fs::write(&printed, render(&first)).unwrap();
        let mut second = resolve(&printed);
        assert!(
            second.watch_requested,
            "the printed file says `watch = true`"
        );
        second.watch_requested = first.watch_requested;
        assert_eq!(second, first, "{}", render(&first));
        assert!(render(&first).contains("method = \"area\""));
    }
}
