//! A call whose answer is read as lines as they arrive (`application/x-ndjson`): the
//! batched phase messages' answers (`protocol::batch`), each line acted on before the next
//! comes, so an early answer is not held back by a late one.

use std::time::Duration;

use bytes::Bytes;
use http_body_util::BodyExt;

use super::{ANSWER_BYTES_MAX, Answer, CallError, Endpoint, JSON};

/// How a call read as lines ended: every line read (how many), or a non-200 answer read whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lines {
    Read(usize),
    Refused(Answer),
}

impl Endpoint {
    /// POSTs `json` to `path` and reads a 200 answer as lines (`application/x-ndjson`: a
    /// batched phase message's answers, `protocol::batch`), calling `on_line` with each whole
    /// line as it arrives, so that early answers take effect while later ones are still being
    /// worked on. A non-200 answer is read whole and returned as [`Lines::Refused`]. The
    /// answer may hold at most `bytes_max` bytes in all, and a line at most
    /// [`ANSWER_BYTES_MAX`]. On a timeout or a broken answer, the lines already passed to
    /// `on_line` stand: the caller knows which items got no answer.
    pub async fn post_json_lines(
        &self,
        path: &str,
        json: Vec<u8>,
        timeout: Duration,
        bytes_max: usize,
        on_line: impl FnMut(&[u8]),
    ) -> Result<Lines, CallError> {
        tokio::time::timeout(
            timeout,
            self.lines_with_one_retry(path, Bytes::from(json), bytes_max, on_line),
        )
        .await
        .unwrap_or(Err(CallError::Timeout(timeout)))
    }

    async fn lines_with_one_retry(
        &self,
        path: &str,
        body: Bytes,
        bytes_max: usize,
        mut on_line: impl FnMut(&[u8]),
    ) -> Result<Lines, CallError> {
        let (sender, reused) = match self.take_idle() {
            Some(sender) => (sender, true),
            None => (self.connect().await?, false),
        };
        let mut sender = sender;
        let response = match self
            .send(&mut sender, hyper::Method::POST, path, body.clone(), JSON)
            .await
        {
            // As for single calls: the peer closed an idle connection as we sent, before any
            // answer; every batched item is idempotent by protocol, so send once more.
            Err(CallError::Exchange { source, .. })
                if reused && (source.is_canceled() || source.is_incomplete_message()) =>
            {
                sender = self.connect().await?;
                self.send(&mut sender, hyper::Method::POST, path, body, JSON)
                    .await?
            }
            result => result?,
        };
        let status = response.status().as_u16();
        if status != 200 {
            let body = self.read_whole(response).await?;
            self.put_idle(sender);
            return Ok(Lines::Refused(Answer { status, body }));
        }
        let body_error = |detail: String| CallError::Body {
            authority: self.authority.clone(),
            detail,
        };
        let mut incoming = response.into_body();
        let mut pending: Vec<u8> = Vec::new();
        let mut total = 0usize;
        let mut lines = 0usize;
        while let Some(frame) = incoming.frame().await {
            let frame = frame.map_err(|e| body_error(e.to_string()))?;
            let Ok(data) = frame.into_data() else {
                continue;
            };
            total += data.len();
            if total > bytes_max {
                return Err(body_error(format!("the answer ran past {bytes_max} bytes")));
            }
            pending.extend_from_slice(&data);
            while let Some(end) = pending.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = pending.drain(..=end).collect();
                let line = &line[..end];
                if !line.is_empty() {
                    lines += 1;
                    on_line(line);
                }
            }
            if pending.len() > ANSWER_BYTES_MAX {
                return Err(body_error(format!(
                    "a line of the answer ran past {ANSWER_BYTES_MAX} bytes"
                )));
            }
        }
        if !pending.is_empty() {
            lines += 1;
            on_line(&pending);
        }
        // Only a connection whose answer was read to the end can carry the next request.
        self.put_idle(sender);
        Ok(Lines::Read(lines))
    }
}
