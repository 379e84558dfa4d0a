//! The clients of the three clouds, built one way: object_store's builder for the scheme,
//! Tessera's timeouts and retries, then every variable of the cloud's prefix in the
//! environment (`AWS_*`, `GOOGLE_*`, `AZURE_*`, read as object_store's own `from_env` reads
//! them, so a variable set there wins, `AWS_ALLOW_HTTP` included), then the bucket and,
//! when no variable gives credentials, unsigned requests (public buckets). Secrets stay in
//! the builder: nothing here logs or returns them.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::sync::Arc;

use object_store::aws::AmazonS3Builder;
use object_store::azure::MicrosoftAzureBuilder;
use object_store::gcp::GoogleCloudStorageBuilder;
use object_store::{ClientOptions, ObjectStore, RetryConfig};

use crate::objstore::address::{Scheme, StoreAddress};

/// How one cloud's client is configured from the environment.
struct Cloud {
    /// The prefix of its variables (`AWS_`).
    prefix: &'static str,
    /// The variables that give credentials: with none of them set (or set to `false`),
    /// requests go unsigned.
    credentials: &'static [&'static str],
    /// Files that give credentials when they exist, under `$HOME`.
    credential_files: &'static [&'static str],
    /// Whether a plain-HTTP endpoint is allowed before the variables say (object_store's
    /// own default for the cloud; `*_ALLOW_HTTP` still decides).
    allow_http: bool,
}

const S3: Cloud = Cloud {
    prefix: "AWS_",
    credentials: &[
        "AWS_ACCESS_KEY_ID",
        "AWS_WEB_IDENTITY_TOKEN_FILE",
        "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    ],
    credential_files: &[],
    allow_http: false,
};

const GCS: Cloud = Cloud {
    prefix: "GOOGLE_",
    credentials: &[
        "GOOGLE_APPLICATION_CREDENTIALS",
        "GOOGLE_SERVICE_ACCOUNT",
        "GOOGLE_SERVICE_ACCOUNT_PATH",
        "GOOGLE_SERVICE_ACCOUNT_KEY",
    ],
    // What `gcloud auth application-default login` writes; object_store reads it.
    credential_files: &[".config/gcloud/application_default_credentials.json"],
    // object_store's GCS client allows it: its endpoint is HTTPS unless a service-account
    // file's `gcs_base_url` (an emulator) or `GOOGLE_BASE_URL` names another.
    allow_http: true,
};

const AZURE: Cloud = Cloud {
    prefix: "AZURE_",
    credentials: &[
        "AZURE_STORAGE_ACCOUNT_KEY",
        "AZURE_STORAGE_ACCESS_KEY",
        "AZURE_STORAGE_MASTER_KEY",
        "AZURE_STORAGE_SAS_KEY",
        "AZURE_STORAGE_SAS_TOKEN",
        "AZURE_STORAGE_TOKEN",
        "AZURE_STORAGE_CLIENT_ID",
        "AZURE_CLIENT_ID",
        "AZURE_FEDERATED_TOKEN_FILE",
        "AZURE_USE_AZURE_CLI",
        "AZURE_MSI_ENDPOINT",
        // The emulator signs with its well-known key unless another is given.
        "AZURE_STORAGE_USE_EMULATOR",
    ],
    credential_files: &[],
    // Azurite (`AZURE_STORAGE_USE_EMULATOR`) is plain HTTP; object_store allows it there.
    allow_http: false,
};

impl Cloud {
    /// Whether nothing in the environment gives credentials.
    fn anonymous(&self) -> bool {
        let home = std::env::var_os("HOME").map(PathBuf::from);
        self.anonymous_with(|var| std::env::var(var).ok(), home.as_deref())
    }

    /// Whether none of the credential variables is set (`var` reads one; set to an empty
    /// string, `false` or `0` counts as unset) and none of the credential files is under
    /// `home`.
    fn anonymous_with(&self, var: impl Fn(&str) -> Option<String>, home: Option<&Path>) -> bool {
        let set = |name: &&str| {
            var(name).is_some_and(|v| !v.is_empty() && !v.eq_ignore_ascii_case("false") && v != "0")
        };
        let exists = |file: &&str| home.is_some_and(|home| home.join(file).is_file());
        !self.credentials.iter().any(set) && !self.credential_files.iter().any(exists)
    }

    /// The cloud's variables among `vars` (the environment), as its builder's
    /// configuration keys (`AWS_REGION` as `aws_region`, as object_store's `from_env`
    /// reads them); variables the builder does not know are left out.
    fn settings<K: FromStr>(
        &self,
        vars: impl Iterator<Item = (OsString, OsString)>,
    ) -> Vec<(K, String)> {
        vars.filter_map(|(key, value)| {
            let (key, value) = (key.into_string().ok()?, value.into_string().ok()?);
            if !key.starts_with(self.prefix) {
                return None;
            }
            Some((key.to_ascii_lowercase().parse().ok()?, value))
        })
        .collect()
    }
}

/// The client of `address`'s bucket (an `s3://`, `gs://` or `az://` address) and whether
/// its requests go unsigned. Dials nothing.
pub fn store(
    address: &StoreAddress,
    options: ClientOptions,
    retry: RetryConfig,
) -> Result<(Arc<dyn ObjectStore>, bool), object_store::Error> {
    // The three builders have the same methods but no common trait: one expression,
    // written once, for each.
    macro_rules! build {
        ($cloud:expr, $builder:expr, $bucket:ident) => {{
            let cloud: &Cloud = &$cloud;
            let anonymous = cloud.anonymous();
            let options = options.with_allow_http(cloud.allow_http);
            let builder = $builder.with_client_options(options).with_retry(retry);
            let builder = cloud
                .settings(std::env::vars_os())
                .into_iter()
                .fold(builder, |b, (key, value)| b.with_config(key, value));
            let store = builder
                .$bucket(&address.bucket)
                .with_skip_signature(anonymous)
                .build()?;
            (Arc::new(store) as Arc<dyn ObjectStore>, anonymous)
        }};
    }
    Ok(match address.scheme {
        Scheme::S3 => build!(S3, AmazonS3Builder::new(), with_bucket_name),
        Scheme::Gcs => build!(GCS, GoogleCloudStorageBuilder::new(), with_bucket_name),
        Scheme::Azure => build!(AZURE, MicrosoftAzureBuilder::new(), with_container_name),
        Scheme::Https | Scheme::Http => {
            return Err(object_store::Error::NotSupported {
                source: format!("{} is a web server's address, not a cloud's", address.url).into(),
            });
        }
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use object_store::azure::AzureConfigKey;
    use object_store::gcp::GoogleConfigKey;

    use super::*;

    fn vars(pairs: &[(&str, &str)]) -> impl Iterator<Item = (OsString, OsString)> {
        pairs
            .iter()
            .map(|(k, v)| (OsString::from(k), OsString::from(v)))
            .collect::<Vec<_>>()
            .into_iter()
    }

    #[test]
    fn each_cloud_reads_its_own_variables_as_its_builder_keys() {
        let env = [
            ("GOOGLE_SERVICE_ACCOUNT", "/etc/sa.json"),
            ("GOOGLE_APPLICATION_CREDENTIALS", "/etc/adc.json"),
            ("GOOGLE_NOT_A_SETTING", "x"),
            ("AZURE_STORAGE_ACCOUNT_NAME", "lab"),
            ("AZURE_STORAGE_SAS_TOKEN", "sv=1&sig=2"),
            ("AWS_REGION", "eu-west-1"),
        ];
        let gcs: Vec<(GoogleConfigKey, String)> = GCS.settings(vars(&env));
        assert_eq!(
            gcs.iter().map(|(k, _)| *k).collect::<Vec<_>>(),
            [
                GoogleConfigKey::ServiceAccount,
                GoogleConfigKey::ApplicationCredentials
            ]
        );
        let azure: Vec<(AzureConfigKey, String)> = AZURE.settings(vars(&env));
        assert_eq!(
            azure,
            [
                (AzureConfigKey::AccountName, "lab".to_string()),
                (AzureConfigKey::SasKey, "sv=1&sig=2".to_string())
            ]
        );
    }

    #[test]
    fn requests_go_unsigned_only_without_credentials() {
        let none = |_: &str| None;
        assert!(GCS.anonymous_with(none, None) && AZURE.anonymous_with(none, None));
        let only = |name: &'static str, value: &'static str| {
            move |var: &str| (var == name).then(|| value.to_string())
        };
        assert!(!GCS.anonymous_with(only("GOOGLE_SERVICE_ACCOUNT_KEY", "{}"), None));
        assert!(!AZURE.anonymous_with(only("AZURE_STORAGE_ACCOUNT_KEY", "a2V5"), None));
        assert!(!AZURE.anonymous_with(only("AZURE_STORAGE_USE_EMULATOR", "true"), None));
        assert!(AZURE.anonymous_with(only("AZURE_STORAGE_USE_EMULATOR", "false"), None));
        // The account's name alone is no credential (a public container).
        assert!(AZURE.anonymous_with(only("AZURE_STORAGE_ACCOUNT_NAME", "lab"), None));
        assert!(!S3.anonymous_with(only("AWS_ACCESS_KEY_ID", "AKIA"), None));
        assert!(S3.anonymous_with(only("AWS_ACCESS_KEY_ID", ""), None));

        let home = tempfile::tempdir().unwrap();
        assert!(GCS.anonymous_with(none, Some(home.path())));
        let adc = home.path().join(".config/gcloud");
        std::fs::create_dir_all(&adc).unwrap();
        std::fs::write(adc.join("application_default_credentials.json"), "{}").unwrap();
        assert!(!GCS.anonymous_with(none, Some(home.path())));
    }
}
