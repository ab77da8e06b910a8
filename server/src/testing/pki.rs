//! A throwaway certificate authority for TLS tests: a CA, a server certificate it
//! signed for `localhost` and 127.0.0.1, and a client certificate it signed, as PEM
//! files in a temporary directory.

use std::path::PathBuf;

use anyhow::Result;
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose,
};

/// The files are `ca.pem`, `server.pem`, `server.key`, `client.pem`, `client.key` and
/// `other.key` (a key that fits no certificate); the CA and the client certificate and
/// key are in memory too.
pub struct TestPki {
    dir: tempfile::TempDir,
    pub ca_pem: String,
    pub client_cert_pem: String,
    pub client_key_pem: String,
}

impl TestPki {
    pub fn new() -> Result<Self> {
        let mut ca = CertificateParams::new(Vec::<String>::new())?;
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, "Sundial test CA");
        ca.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate()?)?;
        let leaf = |names: Vec<String>, usages: Vec<ExtendedKeyUsagePurpose>| -> Result<_> {
            let key = KeyPair::generate()?;
            let mut params = CertificateParams::new(names)?;
            params.extended_key_usages = usages;
            let cert = params.signed_by(&key, &ca)?;
            Ok((cert.pem(), key.serialize_pem()))
        };
        let (server_cert, server_key) = leaf(
            vec!["localhost".into(), "127.0.0.1".into()],
            // A cluster node presents it as a client too, on the TLS cluster bus (which
            // always asks for a client certificate).
            vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ],
        )?;
        let (client_cert_pem, client_key_pem) = leaf(
            vec!["executor.test".into()],
            vec![ExtendedKeyUsagePurpose::ClientAuth],
        )?;
        let dir = tempfile::tempdir()?;
        std::fs::write(dir.path().join("ca.pem"), ca.pem())?;
        std::fs::write(dir.path().join("server.pem"), server_cert)?;
        std::fs::write(dir.path().join("server.key"), server_key)?;
        std::fs::write(dir.path().join("client.pem"), &client_cert_pem)?;
        std::fs::write(dir.path().join("client.key"), &client_key_pem)?;
        std::fs::write(
            dir.path().join("other.key"),
            KeyPair::generate()?.serialize_pem(),
        )?;
        Ok(Self {
            ca_pem: ca.pem(),
            dir,
            client_cert_pem,
            client_key_pem,
        })
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// A file's path as a command-line argument.
    pub fn arg(&self, name: &str) -> String {
        self.path(name).display().to_string()
    }

    /// `redis-server` arguments serving TLS with the server certificate (clients need
    /// no certificate of their own).
    pub fn redis_args(&self) -> Vec<String> {
        self.redis_tls_args(false)
    }

    /// `redis-server` arguments serving TLS with the server certificate to clients that
    /// present a certificate the CA signed (`tls-auth-clients yes`; the plain port, if
    /// any, asks for none).
    pub fn redis_mutual_args(&self) -> Vec<String> {
        self.redis_tls_args(true)
    }

    fn redis_tls_args(&self, mutual: bool) -> Vec<String> {
        vec![
            "--tls-cert-file".into(),
            self.arg("server.pem"),
            "--tls-key-file".into(),
            self.arg("server.key"),
            "--tls-ca-cert-file".into(),
            self.arg("ca.pem"),
            "--tls-auth-clients".into(),
            if mutual { "yes" } else { "no" }.into(),
        ]
    }
}
