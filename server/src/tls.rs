//! TLS for both listeners (rustls, ring). The certificate chain, the private key and,
//! for mutual TLS on gRPC, the client CA are read and checked once, when the
//! configuration is validated, so a bad file stops the server before it binds
//! anything, with an error naming the setting and the file (never the key's bytes).
//!
//! gRPC uses tonic's own TLS acceptor ([`ServerTls::grpc`]). HTTP gets a
//! [`TlsListener`]: an `axum::serve` listener whose handshakes run in their own tasks
//! (one slow client cannot hold up the others) and which hands axum only finished
//! TLS streams, so axum's graceful shutdown works unchanged.

use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls::server::WebPkiClientVerifier;
use tokio_rustls::rustls::{RootCertStore, ServerConfig};
use tokio_rustls::server::TlsStream;
use tracing::{debug, warn};

use crate::auth::Secret;

/// A client that has not finished its handshake by then is dropped.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Handshakes in progress on the HTTP listener; connections beyond are closed at once.
const MAX_HANDSHAKES: usize = 1024;
/// Finished handshakes waiting for axum to take them.
const ACCEPTED_BACKLOG: usize = 64;

#[derive(Debug, thiserror::Error)]
#[error("{field}: {path}: {reason}")]
pub struct Error {
    /// The setting that named the file (`tls_cert`, `tls_key`, `tls_client_ca`).
    pub field: &'static str,
    pub path: PathBuf,
    pub reason: String,
}

/// The validated TLS material of one server instance.
#[derive(Clone)]
pub struct ServerTls {
    cert_path: PathBuf,
    client_ca_path: Option<PathBuf>,
    cert_pem: Vec<u8>,
    key_pem: Secret,
    client_ca_pem: Option<Vec<u8>>,
    /// The HTTP listener's configuration (no client certificates, ALPN http/1.1).
    http: Arc<ServerConfig>,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("cert", &self.cert_path)
            .field("key", &"<redacted>")
            .field("client_ca", &self.client_ca_path)
            .finish()
    }
}

impl ServerTls {
    /// Reads and checks the files: `cert` holds the chain (leaf first), `key` its
    /// private key (PKCS#8, PKCS#1 or SEC1), `client_ca` the CAs that sign the client
    /// certificates gRPC callers must then present.
    pub fn load(cert: &Path, key: &Path, client_ca: Option<&Path>) -> Result<Self, Error> {
        let cert_pem = read("tls_cert", cert)?;
        let chain = certificates("tls_cert", cert, &cert_pem)?;
        let (key_pem, private_key) = private_key("tls_key", key)?;
        let mut http = ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(chain, private_key)
            .map_err(|e| misfit("tls_key", key, cert, &e))?;
        http.alpn_protocols = vec![b"http/1.1".to_vec()];
        let client_ca_pem = match client_ca {
            None => None,
            Some(path) => {
                let pem = read("tls_client_ca", path)?;
                let invalid = |reason: String| Error {
                    field: "tls_client_ca",
                    path: path.to_owned(),
                    reason,
                };
                let mut roots = RootCertStore::empty();
                for ca in certificates("tls_client_ca", path, &pem)? {
                    roots
                        .add(ca)
                        .map_err(|e| invalid(format!("not a usable CA certificate: {e}")))?;
                }
                WebPkiClientVerifier::builder(Arc::new(roots))
                    .build()
                    .map_err(|e| invalid(e.to_string()))?;
                Some(pem)
            }
        };
        Ok(Self {
            cert_path: cert.to_owned(),
            client_ca_path: client_ca.map(Path::to_owned),
            cert_pem,
            key_pem,
            client_ca_pem,
            http: Arc::new(http),
        })
    }

    /// Whether gRPC callers must present a client certificate.
    pub fn mutual(&self) -> bool {
        self.client_ca_pem.is_some()
    }

    /// tonic's configuration for the gRPC listener.
    pub fn grpc(&self) -> tonic::transport::ServerTlsConfig {
        use tonic::transport::{Certificate, Identity, ServerTlsConfig};
        let config = ServerTlsConfig::new()
            .identity(Identity::from_pem(&self.cert_pem, self.key_pem.expose()))
            .timeout(HANDSHAKE_TIMEOUT);
        match &self.client_ca_pem {
            Some(ca) => config.client_ca_root(Certificate::from_pem(ca)),
            None => config,
        }
    }

    /// The HTTP listener over `tcp`.
    pub fn http_listener(&self, tcp: TcpListener) -> io::Result<TlsListener> {
        TlsListener::new(tcp, self.http.clone())
    }
}

/// Reads and checks a file of CA certificates a client trusts (`redis_tls_ca`): PEM,
/// at least one certificate, each usable as a trust anchor. Returns the PEM.
pub fn load_trusted_ca(field: &'static str, path: &Path) -> Result<Vec<u8>, Error> {
    let pem = read(field, path)?;
    let mut roots = RootCertStore::empty();
    for ca in certificates(field, path, &pem)? {
        roots.add(ca).map_err(|e| Error {
            field,
            path: path.to_owned(),
            reason: format!("not a usable CA certificate: {e}"),
        })?;
    }
    Ok(pem)
}

/// A client certificate and its key, for mutual TLS to Redis (`redis_tls_cert`,
/// `redis_tls_key`), read and checked: the chain holds a certificate and the key is
/// its private key.
#[derive(Clone)]
pub struct ClientIdentity {
    /// The chain, leaf first (PEM).
    pub cert_pem: Vec<u8>,
    /// The leaf's private key (PEM).
    pub key_pem: Secret,
}

impl std::fmt::Debug for ClientIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientIdentity")
            .field("key", &"<redacted>")
            .finish_non_exhaustive()
    }
}

/// Reads and checks the certificate chain at `cert` and its private key at `key`
/// (PKCS#8, PKCS#1 or SEC1) a client presents (`redis_tls_cert`, `redis_tls_key`).
pub fn load_client_identity(cert: &Path, key: &Path) -> Result<ClientIdentity, Error> {
    let cert_pem = read("redis_tls_cert", cert)?;
    let chain = certificates("redis_tls_cert", cert, &cert_pem)?;
    let (key_pem, private_key) = private_key("redis_tls_key", key)?;
    tokio_rustls::rustls::ClientConfig::builder()
        .with_root_certificates(RootCertStore::empty())
        .with_client_auth_cert(chain, private_key)
        .map_err(|e| misfit("redis_tls_key", key, cert, &e))?;
    Ok(ClientIdentity { cert_pem, key_pem })
}

/// The private key in the PEM file at `path`, as read and as parsed.
fn private_key(
    field: &'static str,
    path: &Path,
) -> Result<(Secret, PrivateKeyDer<'static>), Error> {
    let pem = Secret::new(read(field, path)?);
    let key = PrivateKeyDer::from_pem_slice(pem.expose()).map_err(|e| Error {
        field,
        path: path.to_owned(),
        reason: match e {
            rustls_pki_types::pem::Error::NoItemsFound => {
                "no private key (PKCS#8, PKCS#1 or SEC1 PEM) found".into()
            }
            other => pem_error(&other),
        },
    })?;
    Ok((pem, key))
}

/// The key at `key` is not the private key of the certificate at `cert`.
fn misfit(field: &'static str, key: &Path, cert: &Path, e: &tokio_rustls::rustls::Error) -> Error {
    Error {
        field,
        path: key.to_owned(),
        reason: format!("does not fit the certificate in {}: {e}", cert.display()),
    }
}

fn read(field: &'static str, path: &Path) -> Result<Vec<u8>, Error> {
    std::fs::read(path).map_err(|e| Error {
        field,
        path: path.to_owned(),
        reason: format!("cannot read: {e}"),
    })
}

fn certificates(
    field: &'static str,
    path: &Path,
    pem: &[u8],
) -> Result<Vec<CertificateDer<'static>>, Error> {
    let invalid = |reason: String| Error {
        field,
        path: path.to_owned(),
        reason,
    };
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| invalid(pem_error(&e)))?;
    if certs.is_empty() {
        return Err(invalid("no CERTIFICATE in PEM format found".into()));
    }
    Ok(certs)
}

/// A PEM error without the bytes some variants carry (they may be key material).
fn pem_error(e: &rustls_pki_types::pem::Error) -> String {
    use rustls_pki_types::pem::Error as E;
    match e {
        E::MissingSectionEnd { .. } => "a PEM section has no END line".into(),
        E::IllegalSectionStart { .. } => "malformed PEM BEGIN line".into(),
        E::Base64Decode(_) => "invalid base64 in a PEM section".into(),
        E::Io(e) => format!("cannot read: {e}"),
        E::NoItemsFound => "nothing usable in PEM format found".into(),
        _ => "invalid PEM".into(),
    }
}

/// An `axum::serve` listener that serves TLS only. A background task accepts TCP
/// connections and runs each handshake in its own task with a timeout; axum takes
/// the finished streams. When axum drops the listener (its graceful shutdown does),
/// the task stops accepting and the socket closes.
pub struct TlsListener {
    accepted: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local_addr: SocketAddr,
}

impl TlsListener {
    fn new(tcp: TcpListener, config: Arc<ServerConfig>) -> io::Result<Self> {
        let local_addr = tcp.local_addr()?;
        let (tx, accepted) = mpsc::channel(ACCEPTED_BACKLOG);
        tokio::spawn(accept_handshakes(tcp, TlsAcceptor::from(config), tx));
        Ok(Self {
            accepted,
            local_addr,
        })
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.accepted.recv().await {
            Some(accepted) => accepted,
            // The accepting task only ends once this receiver is gone.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        Ok(self.local_addr)
    }
}

async fn accept_handshakes(
    tcp: TcpListener,
    acceptor: TlsAcceptor,
    tx: mpsc::Sender<(TlsStream<TcpStream>, SocketAddr)>,
) {
    let handshakes = Arc::new(Semaphore::new(MAX_HANDSHAKES));
    loop {
        let (stream, peer) = tokio::select! {
            () = tx.closed() => return,
            accepted = tcp.accept() => match accepted {
                Ok(a) => a,
                Err(e) if is_connection_error(&e) => continue,
                Err(e) => {
                    // Out of file descriptors and the like: wait rather than spin.
                    warn!(error = %e, "https accept failed");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            },
        };
        // As on plain listeners: no Nagle delay on responses.
        let _ = stream.set_nodelay(true);
        let Ok(permit) = handshakes.clone().try_acquire_owned() else {
            debug!(%peer, "too many TLS handshakes in progress; connection closed");
            continue;
        };
        let acceptor = acceptor.clone();
        let tx = tx.clone();
        tokio::spawn(async move {
            let _permit = permit;
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                Ok(Ok(tls)) => {
                    let _ = tx.send((tls, peer)).await;
                }
                Ok(Err(e)) => debug!(%peer, error = %e, "TLS handshake failed"),
                Err(_) => debug!(%peer, "TLS handshake timed out"),
            }
        });
    }
}

fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}
