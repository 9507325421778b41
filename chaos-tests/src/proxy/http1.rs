//! Just enough HTTP/1.1 for the proxy: read one request (Content-Length bodies only, as reqwest
//! sends them) from a keep-alive connection, and write one answer. Hand-rolled rather than a
//! server framework because the proxy must be able to close a connection without writing a
//! single byte, which a framework's handler cannot do.

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Longest request head (request line and headers) accepted.
const HEAD_BYTES_MAX: usize = 64 * 1024;

#[derive(Debug)]
pub(crate) struct Request {
    pub method: String,
    /// Origin-form target: path and optional query, starting with `/`.
    pub target: String,
    /// Headers as received, minus the framing and hop-by-hop ones the proxy rewrites.
    pub headers: Vec<(String, Vec<u8>)>,
    pub body: Vec<u8>,
    /// The caller asked to close the connection after this exchange (or spoke HTTP/1.0).
    pub close: bool,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum Http1Error {
    #[error("reading request: {0}")]
    Io(#[from] std::io::Error),
    #[error("connection closed mid-request")]
    Truncated,
    #[error("malformed request: {0}")]
    Malformed(&'static str),
    #[error("request head over {HEAD_BYTES_MAX} bytes")]
    HeadTooLarge,
    #[error("request body of {len} bytes is over the proxy's {max}")]
    BodyTooLarge { len: usize, max: usize },
    #[error("chunked request bodies are not supported")]
    Chunked,
}

/// Headers that describe one hop, not the message; the proxy sets its own.
pub(crate) fn is_hop_header(name: &str) -> bool {
    [
        "connection",
        "keep-alive",
        "transfer-encoding",
        "content-length",
        "host",
        "te",
        "trailer",
        "upgrade",
    ]
    .iter()
    .any(|hop| name.eq_ignore_ascii_case(hop))
}

/// Reads the next request. `buf` carries bytes already read past the previous request.
/// `Ok(None)` is a clean close between requests.
pub(crate) async fn read_request<R: AsyncRead + Unpin>(
    reader: &mut R,
    buf: &mut Vec<u8>,
    body_bytes_max: usize,
) -> Result<Option<Request>, Http1Error> {
    let head_len = loop {
        if let Some(at) = find(buf, b"\r\n\r\n") {
            break at + 4;
        }
        if buf.len() > HEAD_BYTES_MAX {
            return Err(Http1Error::HeadTooLarge);
        }
        if read_more(reader, buf).await? == 0 {
            return if buf.is_empty() {
                Ok(None)
            } else {
                Err(Http1Error::Truncated)
            };
        }
    };
    let head = std::str::from_utf8(&buf[..head_len - 4])
        .map_err(|_| Http1Error::Malformed("head is not UTF-8"))?;
    let mut lines = head.split("\r\n");
    let request_line = lines
        .next()
        .ok_or(Http1Error::Malformed("no request line"))?;
    let mut parts = request_line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(Http1Error::Malformed("bad request line"));
    };
    let (method, target) = (method.to_owned(), target.to_owned());
    if !target.starts_with('/') {
        return Err(Http1Error::Malformed("target is not a path"));
    }
    let mut close = match version {
        "HTTP/1.1" => false,
        "HTTP/1.0" => true,
        _ => return Err(Http1Error::Malformed("not HTTP/1.x")),
    };
    let mut content_len = 0usize;
    let mut headers = Vec::new();
    for line in lines {
        let (name, value) = line
            .split_once(':')
            .ok_or(Http1Error::Malformed("header without colon"))?;
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            content_len = value
                .parse()
                .map_err(|_| Http1Error::Malformed("bad content-length"))?;
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            return Err(Http1Error::Chunked);
        } else if name.eq_ignore_ascii_case("connection") {
            close |= value
                .split(',')
                .any(|token| token.trim().eq_ignore_ascii_case("close"));
        }
        if !is_hop_header(name) {
            headers.push((name.to_owned(), value.as_bytes().to_vec()));
        }
    }
    if content_len > body_bytes_max {
        return Err(Http1Error::BodyTooLarge {
            len: content_len,
            max: body_bytes_max,
        });
    }
    let request_len = head_len + content_len;
    while buf.len() < request_len {
        if read_more(reader, buf).await? == 0 {
            return Err(Http1Error::Truncated);
        }
    }
    let body = buf[head_len..request_len].to_vec();
    let request = Request {
        method,
        target,
        headers,
        body,
        close,
    };
    buf.drain(..request_len);
    Ok(Some(request))
}

/// Writes one complete answer with a Content-Length body.
pub(crate) async fn write_response<W: AsyncWrite + Unpin>(
    writer: &mut W,
    status: u16,
    reason: &str,
    headers: &[(String, Vec<u8>)],
    body: &[u8],
    close: bool,
) -> std::io::Result<()> {
    let mut out = format!("HTTP/1.1 {status} {reason}\r\n").into_bytes();
    for (name, value) in headers {
        if is_hop_header(name) {
            continue;
        }
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(format!("content-length: {}\r\n", body.len()).as_bytes());
    if close {
        out.extend_from_slice(b"connection: close\r\n");
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body);
    writer.write_all(&out).await?;
    writer.flush().await
}

async fn read_more<R: AsyncRead + Unpin>(
    reader: &mut R,
    buf: &mut Vec<u8>,
) -> std::io::Result<usize> {
    let mut chunk = [0u8; 8192];
    let n = reader.read(&mut chunk).await?;
    buf.extend_from_slice(&chunk[..n]);
    Ok(n)
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack
        .windows(needle.len())
        .position(|window| window == needle)
}
