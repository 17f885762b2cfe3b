//! HTTPS for the metrics port: a certificate and key from files (a mounted Secret),
//! reloaded when they change, without a restart.
//!
//! The kubelet updates a mounted Secret by writing the new files into a fresh directory
//! and swapping the `..data` symbolic link to it, so one read may see the old certificate
//! and the new key, or the other way round. A pair is taken only when its key matches its
//! certificate; a pair that does not (a half-updated read, a corrupt or missing file) is
//! counted, logged and ignored: the last good pair stays in use, and the files are read
//! again at the next check. The files are read every [`RELOAD_INTERVAL`] (two small
//! reads) and compared with what was last loaded; nothing is parsed unless they changed.
//!
//! TLS 1.2 and 1.3 (rustls on ring), ALPN `http/1.1` only: a client asking for HTTP/2
//! alone is refused during the handshake.

use std::{
    path::{Path, PathBuf},
    sync::{Arc, RwLock},
    time::Duration,
};

use prometheus_client::metrics::{counter::Counter, family::Family};
use rustls::{
    crypto::CryptoProvider,
    pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer},
    server::{ClientHello, ResolvesServerCert},
    sign::CertifiedKey,
    ServerConfig,
};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::labels::ResultLabel;

/// How often the certificate files are compared with the pair in use. The kubelet takes
/// a minute or more to update a mounted Secret; this adds at most a few seconds.
pub const RELOAD_INTERVAL: Duration = Duration::from_secs(2);

/// Largest certificate (chain) or key file read: a chain of a few certificates is a few KiB.
pub const MAX_FILE_BYTES: u64 = 64 * 1024;

/// Where the certificate (PEM, the server's first, then its chain) and its private key
/// (PEM: PKCS#8, PKCS#1 or SEC1) are read.
#[derive(Clone, Debug)]
pub struct CertificateFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl CertificateFiles {
    /// The pair two flags name: both, or none (HTTPS off).
    pub fn from_flags(cert: Option<&PathBuf>, key: Option<&PathBuf>) -> Option<Self> {
        Some(CertificateFiles { cert: cert?.clone(), key: key?.clone() })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("reading {path}: {error}")]
    Read { path: PathBuf, error: std::io::Error },
    #[error("{path} is larger than {MAX_FILE_BYTES} bytes")]
    TooLarge { path: PathBuf },
    #[error("{path} holds no PEM certificate")]
    NoCertificate { path: PathBuf },
    #[error("{path}: {what}")]
    Pem { path: PathBuf, what: String },
    #[error("the key does not fit the certificate, or is of an unsupported kind: {0}")]
    Key(rustls::Error),
    #[error("TLS settings: {0}")]
    Config(rustls::Error),
}

/// The certificate pair in use, swapped whole when the files change.
#[derive(Debug)]
struct CurrentKey(RwLock<Loaded>);

#[derive(Debug)]
struct Loaded {
    key: Arc<CertifiedKey>,
    /// The files' bytes the key was made from, to tell a change.
    cert_pem: Vec<u8>,
    key_pem: Vec<u8>,
}

impl ResolvesServerCert for CurrentKey {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.0.read().ok().map(|loaded| loaded.key.clone())
    }
}

/// The TLS settings of the metrics port, their certificate kept current by
/// [`Tls::keep_current`].
#[derive(Clone)]
pub struct Tls {
    files: CertificateFiles,
    current: Arc<CurrentKey>,
    config: Arc<ServerConfig>,
    provider: Arc<CryptoProvider>,
}

impl Tls {
    /// Loads the pair from `files`: an error when it is not usable (the binary should not
    /// start on it).
    pub async fn load(files: CertificateFiles) -> Result<Tls, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let (cert_pem, key_pem) = read_pair(&files).await?;
        let key = certified_key(&files, &cert_pem, &key_pem, &provider)?;
        let current = Arc::new(CurrentKey(RwLock::new(Loaded { key, cert_pem, key_pem })));
        let mut config = ServerConfig::builder_with_provider(provider.clone())
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .map_err(TlsError::Config)?
            .with_no_client_auth()
            .with_cert_resolver(current.clone());
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Tls { files, current, config: Arc::new(config), provider })
    }

    pub fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(self.config.clone())
    }

    /// Compares the files with the pair in use every [`RELOAD_INTERVAL`] until
    /// `shutdown`, and swaps in a changed pair that is good; `reloads` counts the
    /// outcomes (`loaded`, `invalid`).
    pub async fn keep_current(self, reloads: Family<ResultLabel, Counter>, shutdown: CancellationToken) {
        let mut ticks = tokio::time::interval(RELOAD_INTERVAL);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        // A bad pair is counted and logged once, until the files change again.
        let mut last_bad: Option<Seen> = None;
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = ticks.tick() => {}
            }
            match self.check(&mut last_bad).await {
                Check::Unchanged => {}
                Check::Loaded => {
                    reloads.get_or_create(&ResultLabel { result: "loaded" }).inc();
                    info!(cert = %self.files.cert.display(), "loaded the changed TLS certificate");
                }
                Check::Invalid(e) => {
                    reloads.get_or_create(&ResultLabel { result: "invalid" }).inc();
                    warn!(error = %e, "the TLS certificate files changed but are not usable; serving the last good certificate");
                }
            }
        }
    }

    /// Reads the files once: the pair in use, a good new pair (swapped in), or a bad one
    /// (`Unchanged` when it is the bad one seen last time).
    async fn check(&self, last_bad: &mut Option<Seen>) -> Check {
        let (seen, outcome) = match read_pair(&self.files).await {
            Ok((cert_pem, key_pem)) => {
                if self.current.0.read().is_ok_and(|l| l.cert_pem == cert_pem && l.key_pem == key_pem) {
                    *last_bad = None;
                    return Check::Unchanged;
                }
                match certified_key(&self.files, &cert_pem, &key_pem, &self.provider) {
                    Ok(key) => {
                        if let Ok(mut loaded) = self.current.0.write() {
                            *loaded = Loaded { key, cert_pem, key_pem };
                        }
                        *last_bad = None;
                        return Check::Loaded;
                    }
                    Err(e) => (Seen::Pair(cert_pem, key_pem), e),
                }
            }
            // Unreadable files (e.g. one deleted): a bad pair too.
            Err(e) => (Seen::Error(e.to_string()), e),
        };
        if last_bad.as_ref() == Some(&seen) {
            return Check::Unchanged;
        }
        *last_bad = Some(seen);
        Check::Invalid(outcome)
    }

    /// The certificate (DER) served now.
    pub fn served_certificate(&self) -> Option<CertificateDer<'static>> {
        self.current.0.read().ok().and_then(|l| l.key.cert.first().cloned())
    }
}

enum Check {
    Unchanged,
    Loaded,
    Invalid(TlsError),
}

/// What a check read, to tell the same bad pair from a new one.
#[derive(PartialEq)]
enum Seen {
    Pair(Vec<u8>, Vec<u8>),
    Error(String),
}

async fn read_pair(files: &CertificateFiles) -> Result<(Vec<u8>, Vec<u8>), TlsError> {
    Ok((read_bounded(&files.cert).await?, read_bounded(&files.key).await?))
}

async fn read_bounded(path: &Path) -> Result<Vec<u8>, TlsError> {
    use tokio::io::AsyncReadExt;
    let read_error = |error| TlsError::Read { path: path.to_owned(), error };
    let file = tokio::fs::File::open(path).await.map_err(read_error)?;
    let mut bytes = Vec::new();
    file.take(MAX_FILE_BYTES + 1).read_to_end(&mut bytes).await.map_err(read_error)?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(TlsError::TooLarge { path: path.to_owned() });
    }
    Ok(bytes)
}

/// The pair as rustls serves it, when the key is the certificate's.
fn certified_key(
    files: &CertificateFiles,
    cert_pem: &[u8],
    key_pem: &[u8],
    provider: &CryptoProvider,
) -> Result<Arc<CertifiedKey>, TlsError> {
    let pem_error =
        |path: &Path, e: rustls::pki_types::pem::Error| TlsError::Pem { path: path.to_owned(), what: e.to_string() };
    let chain = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| pem_error(&files.cert, e))?;
    if chain.is_empty() {
        return Err(TlsError::NoCertificate { path: files.cert.clone() });
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| pem_error(&files.key, e))?;
    let signing_key = provider.key_provider.load_private_key(key).map_err(TlsError::Key)?;
    let certified = CertifiedKey::new(chain, signing_key);
    // Unlike CertifiedKey::from_der, an undecidable match is refused too.
    certified.keys_match().map_err(TlsError::Key)?;
    Ok(Arc::new(certified))
}

#[cfg(test)]
mod tests;
