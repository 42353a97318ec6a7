//! Receivers of alerts for the alert tests: a webhook receiver that checks
//! the Standard Webhooks signature of every request against its own secret
//! (answering 401 when it does not verify, as a real receiver would), and
//! an SMTP server that requires STARTTLS before it takes a message.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicU16, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;

use crate::http_request::read_request;

/// A request the webhook receiver accepted.
#[derive(Debug, Clone)]
pub struct Received {
    /// Headers, names lower-cased.
    pub headers: HashMap<String, String>,
    /// The body, parsed.
    pub body: serde_json::Value,
    /// The body as sent.
    pub raw: Vec<u8>,
}

/// A webhook receiver on a loopback port.
pub struct WebhookSink {
    /// Where it listens.
    pub addr: SocketAddr,
    received: Arc<Mutex<Vec<Received>>>,
    rejected: Arc<AtomicUsize>,
    answered: Arc<AtomicUsize>,
    status: Arc<AtomicU16>,
    task: tokio::task::JoinHandle<()>,
}

impl WebhookSink {
    /// Listens on a free loopback port, verifying with `secret`.
    ///
    /// # Panics
    ///
    /// When no port can be bound.
    pub async fn start(secret: &str) -> Self {
        Self::start_on(
            "127.0.0.1:0".parse().unwrap_or_else(|e| panic!("{e}")),
            Some(secret),
        )
        .await
    }

    /// A receiver that checks no signature (a Slack hook).
    ///
    /// # Panics
    ///
    /// When no port can be bound.
    pub async fn start_unsigned() -> Self {
        Self::start_on(
            "127.0.0.1:0".parse().unwrap_or_else(|e| panic!("{e}")),
            None,
        )
        .await
    }

    /// Listens on `addr` (a receiver coming back on its old port),
    /// verifying with `secret` if given.
    ///
    /// # Panics
    ///
    /// When `addr` cannot be bound.
    pub async fn start_on(addr: SocketAddr, secret: Option<&str>) -> Self {
        let listener = TcpListener::bind(addr)
            .await
            .unwrap_or_else(|e| panic!("webhook sink cannot bind {addr}: {e}"));
        let addr = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
        let key = secret.map(belfry_alert::signature::key_of);
        let received: Arc<Mutex<Vec<Received>>> = Arc::default();
        let rejected = Arc::new(AtomicUsize::new(0));
        let answered = Arc::new(AtomicUsize::new(0));
        let status = Arc::new(AtomicU16::new(200));
        let (kept, refused, answer) = (received.clone(), rejected.clone(), status.clone());
        let counted = answered.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (key, kept, refused, answer, counted) = (
                    key.clone(),
                    kept.clone(),
                    refused.clone(),
                    answer.clone(),
                    counted.clone(),
                );
                tokio::spawn(async move {
                    let mut stream = BufReader::new(stream);
                    while let Some(request) = read_request(&mut stream).await {
                        let header =
                            |name: &str| request.headers.get(name).cloned().unwrap_or_default();
                        let timestamp = header("webhook-timestamp").parse::<i64>().unwrap_or(0);
                        let signed = key.as_ref().is_none_or(|key| {
                            belfry_alert::signature::verify(
                                key,
                                &header("webhook-id"),
                                timestamp,
                                &request.body,
                                &header("webhook-signature"),
                            )
                        });
                        counted.fetch_add(1, Ordering::SeqCst);
                        let code = if !signed {
                            refused.fetch_add(1, Ordering::SeqCst);
                            401
                        } else {
                            let code = answer.load(Ordering::SeqCst);
                            if code == 200 {
                                kept.lock()
                                    .unwrap_or_else(|p| p.into_inner())
                                    .push(Received {
                                        headers: request.headers.clone(),
                                        body: serde_json::from_slice(&request.body)
                                            .unwrap_or(serde_json::Value::Null),
                                        raw: request.body.clone(),
                                    });
                            }
                            code
                        };
                        let reply = format!(
                            "HTTP/1.1 {code} X\r\ncontent-length: 0\r\nretry-after: 0\r\n\r\n"
                        );
                        if stream.get_mut().write_all(reply.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        Self {
            addr,
            received,
            rejected,
            answered,
            status,
            task,
        }
    }

    /// The URL to configure.
    pub fn url(&self) -> String {
        format!("http://{}/hook", self.addr)
    }

    /// What it accepted, in arrival order.
    pub fn received(&self) -> Vec<Received> {
        self.received
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Requests answered, whatever the answer.
    pub fn requests(&self) -> usize {
        self.answered.load(Ordering::SeqCst)
    }

    /// Requests refused for a bad signature.
    pub fn rejected(&self) -> usize {
        self.rejected.load(Ordering::SeqCst)
    }

    /// Answers `code` to correctly signed requests from now on (200:
    /// accept and keep them).
    pub fn answer(&self, code: u16) {
        self.status.store(code, Ordering::SeqCst);
    }

    /// Stops listening (connections in progress end with the task).
    pub fn stop(self) -> SocketAddr {
        self.task.abort();
        self.addr
    }
}

/// One message the SMTP server took.
#[derive(Debug, Clone)]
pub struct Mail {
    /// `MAIL FROM`.
    pub from: String,
    /// `RCPT TO`s.
    pub to: Vec<String>,
    /// The message as sent (headers and body).
    pub data: String,
    /// Whether the message came over TLS.
    pub over_tls: bool,
}

/// An SMTP server on a loopback port that offers STARTTLS (with the test
/// CA's `server.crt`) and refuses mail before it, or (with no TLS
/// material) offers no STARTTLS at all.
pub struct SmtpSink {
    /// Where it listens.
    pub addr: SocketAddr,
    mails: Arc<Mutex<Vec<Mail>>>,
    task: tokio::task::JoinHandle<()>,
}

/// Reads SMTP commands off `stream` and answers them; `tls` upgrades the
/// connection on STARTTLS. Returns the stream when STARTTLS was accepted
/// (to continue over TLS), `None` when the session ended.
async fn session<S>(
    stream: S,
    over_tls: bool,
    offer_tls: bool,
    mails: &Mutex<Vec<Mail>>,
) -> Option<S>
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let mut stream = BufReader::new(stream);
    if !over_tls {
        stream
            .get_mut()
            .write_all(b"220 sink ESMTP\r\n")
            .await
            .ok()?;
    }
    let (mut from, mut to) = (String::new(), Vec::new());
    let mut line = String::new();
    loop {
        line.clear();
        if stream.read_line(&mut line).await.ok()? == 0 {
            return None;
        }
        let command = line.trim_end().to_owned();
        let verb = command
            .split_whitespace()
            .next()
            .unwrap_or("")
            .to_ascii_uppercase();
        let reply: String = match verb.as_str() {
            "EHLO" | "HELO" => {
                if offer_tls && !over_tls {
                    "250-sink\r\n250-STARTTLS\r\n250 8BITMIME\r\n".into()
                } else {
                    "250-sink\r\n250 8BITMIME\r\n".into()
                }
            }
            "STARTTLS" if offer_tls && !over_tls => {
                stream.get_mut().write_all(b"220 go ahead\r\n").await.ok()?;
                return Some(stream.into_inner());
            }
            "MAIL" if offer_tls && !over_tls => {
                "530 5.7.0 Must issue a STARTTLS command first\r\n".into()
            }
            "MAIL" => {
                from = command[5..].trim().to_owned();
                "250 ok\r\n".into()
            }
            "RCPT" => {
                to.push(command[5..].trim().to_owned());
                "250 ok\r\n".into()
            }
            "DATA" => {
                stream.get_mut().write_all(b"354 go on\r\n").await.ok()?;
                let mut data = String::new();
                loop {
                    line.clear();
                    if stream.read_line(&mut line).await.ok()? == 0 {
                        return None;
                    }
                    if line == ".\r\n" {
                        break;
                    }
                    data.push_str(&line);
                }
                mails.lock().unwrap_or_else(|p| p.into_inner()).push(Mail {
                    from: std::mem::take(&mut from),
                    to: std::mem::take(&mut to),
                    data,
                    over_tls,
                });
                "250 queued\r\n".into()
            }
            "RSET" | "NOOP" => "250 ok\r\n".into(),
            "QUIT" => {
                let _ = stream.get_mut().write_all(b"221 bye\r\n").await;
                return None;
            }
            _ => "502 not implemented\r\n".into(),
        };
        stream.get_mut().write_all(reply.as_bytes()).await.ok()?;
    }
}

impl SmtpSink {
    /// Listens on a free loopback port; with `tls_dir` (holding
    /// `server.crt` and `server.key`) it offers STARTTLS and requires it.
    ///
    /// # Panics
    ///
    /// When no port can be bound or the TLS material does not load.
    pub async fn start(tls_dir: Option<&Path>) -> Self {
        let acceptor = tls_dir.map(|dir| {
            let certs: Vec<_> = rustls_pemfile::certs(&mut std::io::BufReader::new(
                std::fs::File::open(dir.join("server.crt")).unwrap_or_else(|e| panic!("{e}")),
            ))
            .collect::<Result<_, _>>()
            .unwrap_or_else(|e| panic!("{e}"));
            let key = rustls_pemfile::private_key(&mut std::io::BufReader::new(
                std::fs::File::open(dir.join("server.key")).unwrap_or_else(|e| panic!("{e}")),
            ))
            .unwrap_or_else(|e| panic!("{e}"))
            .unwrap_or_else(|| panic!("no key in server.key"));
            let config = rustls::ServerConfig::builder_with_provider(Arc::new(
                rustls::crypto::ring::default_provider(),
            ))
            .with_safe_default_protocol_versions()
            .unwrap_or_else(|e| panic!("{e}"))
            .with_no_client_auth()
            .with_single_cert(certs, key)
            .unwrap_or_else(|e| panic!("{e}"));
            tokio_rustls::TlsAcceptor::from(Arc::new(config))
        });
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .unwrap_or_else(|e| panic!("smtp sink cannot bind: {e}"));
        let addr = listener.local_addr().unwrap_or_else(|e| panic!("{e}"));
        let mails: Arc<Mutex<Vec<Mail>>> = Arc::default();
        let kept = mails.clone();
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let (kept, acceptor) = (kept.clone(), acceptor.clone());
                tokio::spawn(async move {
                    let offer = acceptor.is_some();
                    let Some(plain) = session(stream, false, offer, &kept).await else {
                        return;
                    };
                    let Some(acceptor) = acceptor else { return };
                    if let Ok(tls) = acceptor.accept(plain).await {
                        let _ = session(tls, true, true, &kept).await;
                    }
                });
            }
        });
        Self { addr, mails, task }
    }

    /// The messages taken, in arrival order.
    pub fn mails(&self) -> Vec<Mail> {
        self.mails.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

impl Drop for SmtpSink {
    fn drop(&mut self) {
        self.task.abort();
    }
}
