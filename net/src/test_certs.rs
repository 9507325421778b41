//! A private CA and server certificates made at test time (rcgen, ring), written as PEM files
//! for the `--tls-*` flags. For tests only (feature `testing`); must never be used to make
//! certificates for a real deployment (docs/operations.md, "TLS", says how).

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType, IsCa, KeyPair,
    KeyUsagePurpose,
};

/// Why a certificate or its file was not made.
#[derive(Debug, thiserror::Error)]
pub enum TestCertError {
    #[error("rcgen: {0}")]
    Make(#[from] rcgen::Error),
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// A certificate authority that exists for one test.
pub struct TestCa {
    issuer: CertifiedIssuer<'static, KeyPair>,
}

impl std::fmt::Debug for TestCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestCa").finish_non_exhaustive()
    }
}

/// A server's certificate (signed by a [`TestCa`]) and its private key, as PEM.
#[derive(Debug, Clone)]
pub struct ServerCert {
    pub cert_pem: String,
    pub key_pem: String,
}

/// The files a server's `--tls-cert` and `--tls-key` take.
#[derive(Debug, Clone)]
pub struct ServerFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

fn write(path: PathBuf, text: &str) -> Result<PathBuf, TestCertError> {
    std::fs::write(&path, text).map_err(|source| TestCertError::Write {
        path: path.clone(),
        source,
    })?;
    Ok(path)
}

impl TestCa {
    /// A new self-signed CA whose common name is `name`.
    pub fn new(name: &str) -> Result<Self, TestCertError> {
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        let mut subject = DistinguishedName::new();
        subject.push(DnType::CommonName, name);
        params.distinguished_name = subject;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let issuer = CertifiedIssuer::self_signed(params, KeyPair::generate()?)?;
        Ok(Self { issuer })
    }

    /// The CA certificate as PEM (what `--tls-ca` takes).
    pub fn cert_pem(&self) -> String {
        self.issuer.pem()
    }

    /// A server certificate for `names` (DNS names or IP addresses, e.g. `127.0.0.1`).
    pub fn server(&self, names: &[&str]) -> Result<ServerCert, TestCertError> {
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = CertificateParams::new(names)?;
        let mut subject = DistinguishedName::new();
        subject.push(DnType::CommonName, "twopc test server");
        params.distinguished_name = subject;
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok(ServerCert {
            cert_pem: cert.pem(),
            key_pem: key.serialize_pem(),
        })
    }

    /// Writes the CA certificate to `dir/ca.pem` and returns its path.
    pub fn write_cert(&self, dir: &Path) -> Result<PathBuf, TestCertError> {
        write(dir.join("ca.pem"), &self.cert_pem())
    }
}

impl ServerCert {
    /// Writes `dir/<stem>.crt` and `dir/<stem>.key`.
    pub fn write(&self, dir: &Path, stem: &str) -> Result<ServerFiles, TestCertError> {
        Ok(ServerFiles {
            cert: write(dir.join(format!("{stem}.crt")), &self.cert_pem)?,
            key: write(dir.join(format!("{stem}.key")), &self.key_pem)?,
        })
    }
}
