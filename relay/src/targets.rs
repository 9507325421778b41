//! What the relay's configuration names: participants (`--participant NAME=URL`), targets
//! (`--target NAME=URL` or `NAME=coordinator-transactions` / `NAME=coordinator-sagas`) and the
//! coordinator group (`--coordinator URL[,URL...]`). These are the only URLs the relay ever
//! calls: an intent names a target, and a name missing here is an error, never a URL.

use std::collections::BTreeMap;

/// Where a target's deliveries go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// POST the delivery to this URL.
    Http(String),
    /// Submit the intent's body as a transaction under the event's id.
    CoordinatorTransactions,
    /// Submit the intent's body as a saga under the event's id.
    CoordinatorSagas,
}

/// What one delivery attempt came to, by the shared design's classification.
#[derive(Debug, Clone, PartialEq)]
pub enum Answer {
    /// The receiver answered for the `event_id` (its answer, or `null`).
    Delivered(serde_json::Value),
    /// No answer known (timeout, connection error, 408, 429, 5xx, an outcome not final yet):
    /// asked again later under the same `event_id`.
    Unknown(String),
    /// Refused for good (another 4xx, an id conflict).
    Refused(String),
}

/// Every name the relay knows, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Routes {
    pub participants: BTreeMap<String, String>,
    pub targets: BTreeMap<String, Target>,
    /// The coordinator group, tried in turn (empty when no target submits to it).
    pub coordinators: Vec<String>,
}

/// A configuration that cannot work.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RoutesError {
    #[error("{flag} {value:?}: expected NAME=VALUE")]
    NoEquals { flag: &'static str, value: String },
    #[error("{flag}: the name {name:?} is given twice")]
    Twice { flag: &'static str, name: String },
    #[error("{flag} {name}: {problem}")]
    BadUrl {
        flag: &'static str,
        name: String,
        problem: String,
    },
    #[error("{flag}: the name {name:?} is not an id (letters, digits, -_.:)")]
    BadName { flag: &'static str, name: String },
    #[error("target {0} submits to the coordinator, and no --coordinator is given")]
    NoCoordinator(String),
    #[error("no --participant given: there is no outbox to relay")]
    NoParticipant,
}

impl Routes {
    /// Checks the flags' values.
    pub fn parse(
        participants: &[String],
        targets: &[String],
        coordinators: Option<&str>,
    ) -> Result<Routes, RoutesError> {
        let mut routes = Routes {
            participants: BTreeMap::new(),
            targets: BTreeMap::new(),
            coordinators: Vec::new(),
        };
        for value in participants {
            let (name, url) = pair("--participant", value)?;
            let url = base_url("--participant", &name, url)?;
            if routes.participants.insert(name.clone(), url).is_some() {
                return Err(RoutesError::Twice {
                    flag: "--participant",
                    name,
                });
            }
        }
        if routes.participants.is_empty() {
            return Err(RoutesError::NoParticipant);
        }
        for value in targets {
            let (name, where_to) = pair("--target", value)?;
            let target = match where_to {
                "coordinator-transactions" => Target::CoordinatorTransactions,
                "coordinator-sagas" => Target::CoordinatorSagas,
                url => Target::Http(full_url("--target", &name, url)?),
            };
            if routes.targets.insert(name.clone(), target).is_some() {
                return Err(RoutesError::Twice {
                    flag: "--target",
                    name,
                });
            }
        }
        for url in coordinators.into_iter().flat_map(|list| list.split(',')) {
            let url = base_url("--coordinator", "", url.trim())?;
            if routes.coordinators.contains(&url) {
                return Err(RoutesError::Twice {
                    flag: "--coordinator",
                    name: url,
                });
            }
            routes.coordinators.push(url);
        }
        if routes.coordinators.is_empty()
            && let Some((name, _)) = routes
                .targets
                .iter()
                .find(|(_, t)| !matches!(t, Target::Http(_)))
        {
            return Err(RoutesError::NoCoordinator(name.clone()));
        }
        Ok(routes)
    }
}

fn pair<'a>(flag: &'static str, value: &'a str) -> Result<(String, &'a str), RoutesError> {
    let Some((name, rest)) = value.split_once('=') else {
        return Err(RoutesError::NoEquals {
            flag,
            value: value.to_string(),
        });
    };
    let name = name.trim();
    let is_id = !name.is_empty()
        && name.len() <= protocol::outbox::OUTBOX_ID_LEN_MAX
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':'));
    if !is_id {
        return Err(RoutesError::BadName {
            flag,
            name: name.to_string(),
        });
    }
    Ok((name.to_string(), rest.trim()))
}

/// An `http://` or `https://` URL with a host (a target's path is kept).
fn full_url(flag: &'static str, name: &str, text: &str) -> Result<String, RoutesError> {
    let bad = |problem: String| RoutesError::BadUrl {
        flag,
        name: name.to_string(),
        problem,
    };
    let url = reqwest::Url::parse(text).map_err(|e| bad(format!("{text:?}: {e}")))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none_or(str::is_empty) {
        return Err(bad(format!("{text:?} is not an http:// or https:// URL")));
    }
    if !url.username().is_empty() || url.password().is_some() || url.fragment().is_some() {
        return Err(bad(format!("{text:?} carries a user or a fragment")));
    }
    Ok(url.to_string())
}

/// A base URL (no path, query or fragment), without its trailing `/`.
fn base_url(flag: &'static str, name: &str, text: &str) -> Result<String, RoutesError> {
    let url = full_url(flag, name, text)?;
    let parsed = reqwest::Url::parse(&url).map_err(|e| RoutesError::BadUrl {
        flag,
        name: name.to_string(),
        problem: e.to_string(),
    })?;
    if parsed.path() != "/" || parsed.query().is_some() {
        return Err(RoutesError::BadUrl {
            flag,
            name: name.to_string(),
            problem: format!("{text:?} must be a base URL (http://host:port)"),
        });
    }
    Ok(url.trim_end_matches('/').to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn strings(values: &[&str]) -> Vec<String> {
        values.iter().map(|v| v.to_string()).collect()
    }

    #[test]
    fn names_map_to_urls_and_coordinator_targets() {
        let routes = Routes::parse(
            &strings(&["orders=http://127.0.0.1:7201/"]),
            &strings(&[
                "payments=http://127.0.0.1:9000/v1/payments",
                "checkout=coordinator-transactions",
                "flows=coordinator-sagas",
            ]),
            Some("http://a:7100, http://b:7100"),
        )
        .unwrap();
        assert_eq!(routes.participants["orders"], "http://127.0.0.1:7201");
        assert_eq!(
            routes.targets["payments"],
            Target::Http("http://127.0.0.1:9000/v1/payments".into())
        );
        assert_eq!(routes.targets["flows"], Target::CoordinatorSagas);
        assert_eq!(routes.coordinators, ["http://a:7100", "http://b:7100"]);
    }

    #[test]
    fn bad_configurations_are_refused() {
        let p = strings(&["orders=http://127.0.0.1:7201"]);
        let parse = |p: &[String], t: &[&str], c: Option<&str>| Routes::parse(p, &strings(t), c);
        assert!(matches!(
            parse(&[], &[], None),
            Err(RoutesError::NoParticipant)
        ));
        assert!(matches!(
            parse(&p, &["x=coordinator-sagas"], None),
            Err(RoutesError::NoCoordinator(_))
        ));
        assert!(matches!(
            parse(&p, &["x"], None),
            Err(RoutesError::NoEquals { .. })
        ));
        assert!(matches!(
            parse(&p, &["x=ftp://h/"], None),
            Err(RoutesError::BadUrl { .. })
        ));
        assert!(matches!(
            parse(&p, &["a b=http://h/"], None),
            Err(RoutesError::BadName { .. })
        ));
        assert!(matches!(
            parse(&p, &["x=http://h/", "x=http://i/"], None),
            Err(RoutesError::Twice { .. })
        ));
        assert!(matches!(
            parse(&strings(&["o=http://h:1/v1"]), &[], None),
            Err(RoutesError::BadUrl { .. })
        ));
    }
}
