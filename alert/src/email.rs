//! The e-mail channel: a plain-text message over SMTP with lettre, the
//! connection secured by STARTTLS (required: never falls back to
//! plaintext), implicit TLS, or (only to a relay on this machine) nothing.
//! The server's certificate is verified against the built-in roots and the
//! channel's `ca_file`, if given.
//!
//! An SMTP 5xx answer (a recipient refused, a message rejected) is final;
//! a 4xx, a refused connection, a failed handshake or a timeout is retried.

use lettre::message::header::ContentType;
use lettre::message::Mailbox;
use lettre::transport::smtp::authentication::Credentials;
use lettre::transport::smtp::client::{Certificate, Tls, TlsParameters};
use lettre::{AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};

use crate::channel::SendOutcome;
use crate::config::{ChannelConfig, ChannelKind, SmtpTls};
use crate::message::AlertMessage;

/// An e-mail channel's sender.
pub struct EmailSender {
    transport: AsyncSmtpTransport<Tokio1Executor>,
    from: Mailbox,
    to: Vec<Mailbox>,
}

impl std::fmt::Debug for EmailSender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EmailSender")
            .field("from", &self.from.to_string())
            .field("to", &self.to.len())
            .finish()
    }
}

impl EmailSender {
    /// The sender of `channel` (an e-mail channel).
    ///
    /// # Errors
    ///
    /// The reason, when the channel is not an e-mail channel, an address
    /// does not parse, or the CA file holds no certificate.
    pub fn new(channel: &ChannelConfig) -> Result<Self, String> {
        let ChannelKind::Email {
            host,
            port,
            tls,
            ca_pem,
            credentials,
            from,
            to,
        } = &channel.kind
        else {
            return Err("not an email channel".into());
        };
        let tls_parameters = || -> Result<TlsParameters, String> {
            let mut builder = TlsParameters::builder(host.clone());
            if let Some(pem) = ca_pem {
                let ca = Certificate::from_pem(pem)
                    .map_err(|e| format!("ca_file holds no usable certificate: {e}"))?;
                builder = builder.add_root_certificate(ca);
            }
            builder
                .build_rustls()
                .map_err(|e| format!("cannot set up TLS for {host}: {e}"))
        };
        let tls = match tls {
            SmtpTls::Starttls => Tls::Required(tls_parameters()?),
            SmtpTls::Tls => Tls::Wrapper(tls_parameters()?),
            SmtpTls::None => Tls::None,
        };
        let mut builder = AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous(host.clone())
            .port(*port)
            .tls(tls)
            .timeout(Some(channel.timeout));
        if let Some((user, password)) = credentials {
            builder = builder.credentials(Credentials::new(
                user.expose().to_owned(),
                password.expose().to_owned(),
            ));
        }
        let from: Mailbox = from.parse().map_err(|e| format!("from = {from:?}: {e}"))?;
        let to = to
            .iter()
            .map(|t| t.parse().map_err(|e| format!("to: {t:?}: {e}")))
            .collect::<Result<Vec<Mailbox>, String>>()?;
        Ok(Self {
            transport: builder.build(),
            from,
            to,
        })
    }

    /// One attempt.
    pub async fn send(&self, message: &AlertMessage) -> SendOutcome {
        let mut email = Message::builder()
            .from(self.from.clone())
            .subject(message.title.clone())
            .header(ContentType::TEXT_PLAIN);
        for to in &self.to {
            email = email.to(to.clone());
        }
        let email = match email.body(message.text()) {
            Ok(email) => email,
            Err(e) => return SendOutcome::Permanent(format!("cannot build the message: {e}")),
        };
        match self.transport.send(email).await {
            Ok(_) => SendOutcome::Delivered,
            Err(e) if e.is_permanent() => SendOutcome::Permanent(format!("SMTP: {e}")),
            Err(e) => SendOutcome::Retry {
                after: None,
                error: format!("SMTP: {e}"),
            },
        }
    }
}
