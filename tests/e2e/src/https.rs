//! An HTTPS client for the binaries' metrics ports, as Prometheus reaches them: the
//! server's certificate checked against a CA for a DNS name, a bearer token, HTTP/1.1.
//! It also tells which certificate was served and which ALPN protocol was agreed.

use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpStream},
    sync::Arc,
    time::Duration,
};

use anyhow::{anyhow, Context};
use rustls::pki_types::{pem::PemObject, CertificateDer, ServerName};

/// What a server answered.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    /// The response head, lower-cased.
    pub head: String,
    pub body: String,
    /// The certificate the server presented (DER).
    pub certificate: Vec<u8>,
}

/// A client trusting one CA, checking one server name.
#[derive(Clone)]
pub struct Client {
    config: Arc<rustls::ClientConfig>,
    server_name: ServerName<'static>,
}

impl Client {
    /// `ca_pem`: the CA certificate(s); `server_name`: the DNS name the server's certificate
    /// must carry (the Service's, as the chart's monitors set `tlsConfig.serverName`).
    pub fn new(ca_pem: &[u8], server_name: &str) -> anyhow::Result<Client> {
        Self::with_alpn(ca_pem, server_name, &[b"http/1.1"])
    }

    /// As [`Client::new`], offering these ALPN protocols.
    pub fn with_alpn(ca_pem: &[u8], server_name: &str, alpn: &[&[u8]]) -> anyhow::Result<Client> {
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_slice_iter(ca_pem) {
            roots.add(cert.context("a PEM CA certificate")?).context("adding the CA")?;
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots)
            .with_no_client_auth();
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        // A full handshake each time: a resumed session skips the certificate.
        config.resumption = rustls::client::Resumption::disabled();
        let server_name = ServerName::try_from(server_name.to_owned()).context("a DNS name")?;
        Ok(Client { config: Arc::new(config), server_name })
    }

    /// Completes a handshake and returns the protocol agreed by ALPN (`None`: none), or
    /// the handshake's error.
    pub fn handshake(&self, addr: SocketAddr) -> anyhow::Result<Option<Vec<u8>>> {
        let (mut tls, mut tcp) = self.connect(addr)?;
        while tls.is_handshaking() {
            tls.complete_io(&mut tcp).context("TLS handshake")?;
        }
        Ok(tls.alpn_protocol().map(<[u8]>::to_vec))
    }

    /// `GET path` with `Authorization: Bearer <token>` when given.
    pub fn get(&self, addr: SocketAddr, path: &str, token: Option<&str>) -> anyhow::Result<Answer> {
        self.get_from(None, addr, path, token)
    }

    /// As [`Client::get`], from the loopback address `source` when given.
    pub fn get_from(
        &self,
        source: Option<std::net::IpAddr>,
        addr: SocketAddr,
        path: &str,
        token: Option<&str>,
    ) -> anyhow::Result<Answer> {
        let (tls, tcp) = self.connect_from(source, addr)?;
        let mut stream = rustls::StreamOwned::new(tls, tcp);
        let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
        write!(stream, "GET {path} HTTP/1.1\r\nHost: {}\r\n{auth}Connection: close\r\n\r\n", self.host())
            .context("sending the request")?;
        let mut raw = Vec::new();
        match stream.read_to_end(&mut raw) {
            Ok(_) => {}
            // A server that closes without close_notify after a complete answer.
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !raw.is_empty() => {}
            Err(e) => return Err(e).context("reading the answer"),
        }
        let certificate = stream
            .conn
            .peer_certificates()
            .and_then(|c| c.first())
            .map(|c| c.to_vec())
            .ok_or_else(|| anyhow!("no server certificate"))?;
        let split = raw.windows(4).position(|w| w == b"\r\n\r\n").ok_or_else(|| anyhow!("no response head"))?;
        let head = String::from_utf8_lossy(&raw[..split]).to_ascii_lowercase();
        let status = head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).context("a status code")?;
        let body = &raw[split + 4..];
        let body = if head.contains("transfer-encoding: chunked") { dechunk(body) } else { body.to_vec() };
        Ok(Answer { status, head, body: String::from_utf8_lossy(&body).into_owned(), certificate })
    }

    fn host(&self) -> String {
        match &self.server_name {
            ServerName::DnsName(name) => name.as_ref().to_owned(),
            other => format!("{other:?}"),
        }
    }

    fn connect(&self, addr: SocketAddr) -> anyhow::Result<(rustls::ClientConnection, TcpStream)> {
        self.connect_from(None, addr)
    }

    fn connect_from(
        &self,
        source: Option<std::net::IpAddr>,
        addr: SocketAddr,
    ) -> anyhow::Result<(rustls::ClientConnection, TcpStream)> {
        let tcp = match source {
            Some(source) => crate::connect_from(source, addr),
            None => TcpStream::connect_timeout(&addr, Duration::from_secs(2)),
        }
        .with_context(|| format!("connecting {addr}"))?;
        tcp.set_read_timeout(Some(Duration::from_secs(10)))?;
        tcp.set_write_timeout(Some(Duration::from_secs(10)))?;
        let tls = rustls::ClientConnection::new(self.config.clone(), self.server_name.clone())?;
        Ok((tls, tcp))
    }
}

/// The payload of a chunked body (sizes count bytes).
pub fn dechunk(mut body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(line_end) = body.windows(2).position(|w| w == b"\r\n") {
        let size = std::str::from_utf8(&body[..line_end]).ok().and_then(|s| usize::from_str_radix(s.trim(), 16).ok());
        let rest = &body[line_end + 2..];
        match size {
            Some(size) if size > 0 && rest.len() >= size => {
                out.extend_from_slice(&rest[..size]);
                body = rest[size..].strip_prefix(b"\r\n").unwrap_or(&rest[size..]);
            }
            _ => break,
        }
    }
    out
}

/// A directory laid out as the kubelet lays out a Secret volume: `tls.crt`, `tls.key`
/// (and `ca.crt`) are links into `..data`, a link swapped atomically to a new directory on
/// each update. Removed on drop.
pub struct SecretVolume {
    pub dir: std::path::PathBuf,
    version: u32,
}

impl SecretVolume {
    pub fn new(dir: std::path::PathBuf, files: &[(&str, &[u8])]) -> anyhow::Result<SecretVolume> {
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        for (name, _) in files {
            std::os::unix::fs::symlink(format!("..data/{name}"), dir.join(name))?;
        }
        let mut volume = SecretVolume { dir, version: 0 };
        volume.publish(files)?;
        Ok(volume)
    }

    pub fn path(&self, name: &str) -> std::path::PathBuf {
        self.dir.join(name)
    }

    /// Writes `files` into a new directory and swaps `..data` to it in one rename.
    pub fn publish(&mut self, files: &[(&str, &[u8])]) -> anyhow::Result<()> {
        self.version += 1;
        let version = format!("..{}_{:08x}", self.version, crate::random_u32());
        std::fs::create_dir(self.dir.join(&version))?;
        for (name, content) in files {
            std::fs::write(self.dir.join(&version).join(name), content)?;
        }
        let next = self.dir.join("..data_tmp");
        std::os::unix::fs::symlink(&version, &next)?;
        std::fs::rename(&next, self.dir.join("..data"))?;
        Ok(())
    }
}

impl Drop for SecretVolume {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// DER of the first certificate of a PEM text.
pub fn der(pem: &[u8]) -> anyhow::Result<Vec<u8>> {
    Ok(CertificateDer::from_pem_slice(pem).context("a PEM certificate")?.to_vec())
}
