//! One request to the coordinator group and what its answer means for ctl's exit code: a
//! refusal or failure is printed with the coordinator's own words (and evidence), an
//! unreachable group is told apart from one that said no. Finding the leader among the
//! `--coordinator` addresses is `crate::coordinator_group`'s.

use serde_json::Value;

use protocol::ErrorBody;
use protocol::operator::RefusalBody;

use super::text::evidence_text;
use crate::coordinator_group::{Answer, Group, Request, Resend, SendError};
use crate::printable::{printable as p, printable_json, printable_lines};

/// A failure with the exit code it means.
pub struct Failed {
    pub code: u8,
    pub message: String,
}

/// The coordinators ctl talks to, and whether to print their JSON as it is.
pub struct Call {
    pub group: Group,
    pub json: bool,
}

impl Call {
    pub async fn get(&self, path: &str) -> Result<Value, Failed> {
        self.send(&Request::get(path)).await
    }

    /// A GET whose 404 means "none" rather than a failure.
    pub async fn get_optional(&self, path: &str) -> Result<Value, Failed> {
        match self.get(path).await {
            Err(Failed { code: 1, message }) if message.starts_with("not_found") => Ok(Value::Null),
            other => other,
        }
    }

    /// A POST; `resend` says whether another coordinator of the group may be asked when the
    /// first does not take it (see `Resend`).
    pub async fn post(&self, path: &str, body: &Value, resend: Resend) -> Result<Value, Failed> {
        self.send(&Request::post(path, body.clone(), resend)).await
    }

    async fn send(&self, request: &Request) -> Result<Value, Failed> {
        let Answer {
            status,
            body: bytes,
            ..
        } = self.group.send(request).await.map_err(|e| Failed {
            // Nobody answered at all: unreachable (3); somebody declined: a failure (1).
            code: match &e {
                SendError::Exhausted(exhausted) if exhausted.none_answered() => 3,
                _ => 1,
            },
            message: e.to_string(),
        })?;
        let body: Value = serde_json::from_slice(&bytes).map_err(|e| Failed {
            code: 1,
            message: format!("HTTP {status}: the answer is not JSON: {e}"),
        })?;
        if status.is_success() {
            return Ok(body);
        }
        let message = if let Ok(refusal) = serde_json::from_value::<RefusalBody>(body.clone()) {
            format!(
                "{}: {}\n{}",
                refusal.error,
                p(&refusal.message),
                evidence_text(&refusal.evidence)
            )
        } else if let Ok(error) = serde_json::from_value::<ErrorBody>(body.clone()) {
            format!("{}: {}", error.error, p(&error.message))
        } else {
            format!("HTTP {status}: {}", printable_json(&body.to_string()))
        };
        Err(Failed { code: 1, message })
    }

    pub fn print(
        &self,
        body: &Value,
        readable: impl FnOnce(&Value) -> serde_json::Result<String>,
    ) -> Result<(), Failed> {
        if self.json {
            println!("{}", printable_json(&body.to_string()));
            return Ok(());
        }
        let text = readable(body).map_err(|e| Failed {
            code: 1,
            message: format!("unexpected answer shape ({e}): {body}"),
        })?;
        // Each peer-supplied field was escaped where it was laid out; this catches any other.
        print!("{}", printable_lines(&text));
        Ok(())
    }
}
