//! Reading one HTTP/1.1 request off a keep-alive connection, for the test
//! servers (the fault suite's probe, the OTLP sink): request line, headers
//! up to the empty line, and a `content-length` body. Nothing else of HTTP
//! is needed by belfry's clients (reqwest sends no chunked requests here).

use std::collections::HashMap;

use tokio::io::{AsyncBufRead, AsyncBufReadExt, AsyncReadExt};

/// One request.
#[derive(Debug)]
pub struct Request {
    /// The request target (`/v1/traces`).
    pub path: String,
    /// Headers, names lower-cased.
    pub headers: HashMap<String, String>,
    /// The body (`content-length` bytes).
    pub body: Vec<u8>,
}

/// Reads the next request; `None` when the connection ends or breaks.
pub async fn read_request<R: AsyncBufRead + Unpin>(stream: &mut R) -> Option<Request> {
    let mut line = String::new();
    if stream.read_line(&mut line).await.ok()? == 0 {
        return None;
    }
    let path = line.split_whitespace().nth(1).unwrap_or("").to_owned();
    let mut headers = HashMap::new();
    loop {
        line.clear();
        if stream.read_line(&mut line).await.ok()? == 0 {
            return None;
        }
        let header = line.trim_end();
        if header.is_empty() {
            break;
        }
        if let Some((k, v)) = header.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_owned());
        }
    }
    let length = headers
        .get("content-length")
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(0);
    let mut body = vec![0u8; length];
    stream.read_exact(&mut body).await.ok()?;
    Some(Request {
        path,
        headers,
        body,
    })
}
