//! docs/openapi.json against the server, so the two cannot drift: every served route is in the
//! document with its methods and its security (the class `api::auth` gives it), every limit
//! constant equals the number the document states, and every error response lists only codes
//! that carry its status. Schemathesis (tests/schemathesis/run.sh) then checks the live server's
//! answers against the same document.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Value, json};

use protocol::auth::Access;
use protocol::lease::{
    LEASE_NAME_LEN_MAX, LEASE_TTL_MS_DEFAULT, LEASE_TTL_MS_MAX, LEASE_TTL_MS_MIN,
};
use protocol::limits::{
    BODY_BYTES_MAX, GTID_LEN_MAX, LIST_LIMIT_MAX, NAME_LEN_MAX, PARTICIPANTS_MAX,
    PAYLOAD_BYTES_MAX, REASON_LEN_MAX, TIMEOUT_MS_MAX, TIMEOUT_MS_MIN, TXID_LEN_MAX,
};
use protocol::operator::{OPERATOR_LEN_MAX, REASON_LEN_MAX as OPERATOR_REASON_LEN_MAX};
use protocol::saga::{SAGA_STEPS_MAX, SAGA_TIMEOUT_MS_DEFAULT, SAGA_TIMEOUT_MS_MAX};
use protocol::{ErrorCode, TxId};

use super::tests::{JSON, call, ready_router};
use super::transactions::LIST_LIMIT_DEFAULT;
use super::{ROUTES, auth};

const METHODS: [&str; 7] = ["get", "post", "put", "delete", "patch", "head", "options"];

fn document() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/openapi.json");
    let text = std::fs::read_to_string(path).expect("docs/openapi.json is readable");
    serde_json::from_str(&text).expect("docs/openapi.json is JSON")
}

/// Follows a local `$ref` (`#/components/...`) until a value without one.
fn resolve<'a>(doc: &'a Value, mut value: &'a Value) -> &'a Value {
    while let Some(reference) = value.get("$ref").and_then(Value::as_str) {
        let pointer = reference.strip_prefix('#').expect("a local $ref");
        value = doc
            .pointer(pointer)
            .unwrap_or_else(|| panic!("{reference} is defined"));
    }
    value
}

/// Every (method, path, operation) of the document.
fn operations(doc: &Value) -> Vec<(String, String, &Value)> {
    let mut found = Vec::new();
    for (path, item) in doc["paths"].as_object().expect("paths") {
        for (method, operation) in item.as_object().expect("a path item") {
            if METHODS.contains(&method.as_str()) {
                found.push((method.clone(), path.clone(), operation));
            }
        }
    }
    found
}

fn operation<'a>(doc: &'a Value, method: &str, path: &str) -> &'a Value {
    let found = &doc["paths"][path][method];
    assert!(found.is_object(), "{method} {path} is documented");
    found
}

fn schema<'a>(doc: &'a Value, name: &str) -> &'a Value {
    let found = &doc["components"]["schemas"][name];
    assert!(found.is_object(), "schema {name} is documented");
    found
}

fn number(value: &Value, what: &str) -> u64 {
    value
        .as_u64()
        .unwrap_or_else(|| panic!("{what} is a number in the document, found {value}"))
}

/// The security requirement the document must state for a route of class `access`.
fn expected_security(access: Access, path: &str) -> Value {
    match access {
        Access::Open => json!([]),
        Access::Metrics => json!([{"metricsToken": []}, {}]),
        Access::Client => json!([{"clientToken": []}, {"operatorToken": []}]),
        Access::Peer => json!([{"peerToken": []}]),
        Access::Operator if path == protocol::routes::UI => {
            json!([{"operatorToken": []}, {"operatorBasic": []}])
        }
        Access::Operator => json!([{"operatorToken": []}]),
        Access::PeerOrOperator => json!([{"peerToken": []}, {"operatorToken": []}]),
    }
}

#[tokio::test]
async fn every_served_route_is_documented_with_its_methods_and_nothing_else() {
    let doc = document();
    assert_eq!(doc["openapi"], "3.0.3");
    let documented: BTreeSet<(String, String)> = operations(&doc)
        .into_iter()
        .map(|(method, path, _)| (method, path))
        .collect();
    let served: BTreeSet<(String, String)> = ROUTES
        .iter()
        .map(|(m, p)| (m.to_string(), p.to_string()))
        .collect();
    assert_eq!(documented, served);
    // And each one really is routed: not 404 unknown_route, not 405.
    let (app, _dir) = ready_router().await;
    for (method, path) in &served {
        let uri = path.replace("{id}", "t-1").replace("{name}", "n-1");
        let (status, body) = call(&app, &method.to_uppercase(), &uri, JSON, b"{}".to_vec()).await;
        assert!(
            body["error"] != "unknown_route" && status.as_u16() != 405,
            "{method} {path}: {status} {body}"
        );
    }
}

#[test]
fn operation_ids_are_unique_and_every_link_names_one() {
    let doc = document();
    let mut ids = BTreeSet::new();
    for (method, path, operation) in operations(&doc) {
        let id = operation["operationId"]
            .as_str()
            .unwrap_or_else(|| panic!("{method} {path} has an operationId"));
        assert!(ids.insert(id.to_string()), "{id} is used twice");
    }
    let mut links = 0;
    for (method, path, operation) in operations(&doc) {
        for response in operation["responses"]
            .as_object()
            .expect("responses")
            .values()
        {
            for (name, link) in response["links"].as_object().into_iter().flatten() {
                let target = link["operationId"].as_str().expect("a link by operationId");
                assert!(
                    ids.contains(target),
                    "{method} {path} link {name}: {target}"
                );
                links += 1;
            }
        }
    }
    assert!(links >= 10, "{links} links");
}

#[test]
fn every_route_states_the_security_its_class_takes() {
    let doc = document();
    let schemes = doc["components"]["securitySchemes"]
        .as_object()
        .expect("security schemes");
    for bearer in ["clientToken", "operatorToken", "peerToken", "metricsToken"] {
        assert_eq!(
            schemes[bearer],
            json!({"type": "http", "scheme": "bearer", "description": schemes[bearer]["description"]}),
            "{bearer}"
        );
    }
    assert_eq!(schemes["operatorBasic"]["scheme"], "basic");
    for (method, path) in ROUTES {
        let access = auth::access(path).expect("classified");
        let operation = operation(&doc, method, path);
        assert_eq!(
            operation["security"],
            expected_security(access, path),
            "{method} {path}"
        );
        let responses = operation["responses"].as_object().expect("responses");
        let checked = access != Access::Open;
        assert_eq!(
            responses.contains_key("401"),
            checked,
            "{method} {path}: 401 documented iff the route checks tokens"
        );
        if checked {
            assert_eq!(
                error_codes(&doc, &responses["401"]),
                Some(BTreeSet::from(["unauthorized".to_string()])),
                "{method} {path} 401"
            );
        }
        // 403: `forbidden` where tokens are checked, `forbidden_origin` on every write
        // (cross_site), `forbidden_host` everywhere (a loopback server without tokens).
        let mut forbidden = BTreeSet::from(["forbidden_host".to_string()]);
        if checked {
            forbidden.insert("forbidden".to_string());
        }
        let write = protocol::cross_site::is_state_changing(&method.to_ascii_uppercase());
        if write {
            forbidden.insert("forbidden_origin".to_string());
            assert!(
                responses.contains_key("415"),
                "{method} {path}: every write may be refused 415"
            );
        }
        assert_eq!(
            error_codes(&doc, &responses["403"]),
            Some(forbidden),
            "{method} {path} 403"
        );
    }
    let unauthorized = &doc["components"]["responses"]["Unauthorized"];
    assert!(unauthorized["headers"]["WWW-Authenticate"].is_object());
}

/// The `error` codes a response's JSON body may carry, if it names them.
fn error_codes(doc: &Value, response: &Value) -> Option<BTreeSet<String>> {
    let response = resolve(doc, response);
    let body = resolve(doc, &response["content"]["application/json"]["schema"]);
    let codes = body["properties"]["error"]["enum"].as_array()?;
    Some(
        codes
            .iter()
            .map(|c| c.as_str().expect("a code").to_string())
            .collect(),
    )
}

/// Codes only participants answer with (docs/participants.md): never in a coordinator answer.
const PARTICIPANT_ONLY: [ErrorCode; 15] = [
    ErrorCode::StaleEpoch,
    ErrorCode::NotPrepared,
    ErrorCode::IncarnationConflict,
    ErrorCode::InvalidPayload,
    ErrorCode::StaleToken,
    ErrorCode::KeyLocked,
    ErrorCode::EpochTooHigh,
    ErrorCode::OpIdConflict,
    ErrorCode::InvalidFenceProof,
    ErrorCode::TokenTooHigh,
    ErrorCode::FenceChanged,
    ErrorCode::InvalidReset,
    ErrorCode::CoordinatorIdRequired,
    ErrorCode::ConditionFailed,
    ErrorCode::IntentOutOfOrder,
];

#[test]
fn every_error_response_lists_only_codes_of_its_status_and_every_code_is_somewhere() {
    let doc = document();
    let mut seen = BTreeSet::new();
    for (method, path, operation) in operations(&doc) {
        for (status, response) in operation["responses"].as_object().expect("responses") {
            let status: u16 = status.parse().expect("a numeric status");
            let Some(codes) = error_codes(&doc, response) else {
                assert!(
                    status < 400,
                    "{method} {path} {status}: error codes are named"
                );
                continue;
            };
            assert!(status >= 400, "{method} {path} {status} is an error");
            for code in codes {
                let parsed: ErrorCode = serde_json::from_value(json!(code))
                    .unwrap_or_else(|_| panic!("{method} {path}: {code} is an error code"));
                assert_eq!(
                    parsed.status(),
                    status,
                    "{method} {path}: {code} is documented under the wrong status"
                );
                seen.insert(parsed.as_str());
            }
        }
    }
    // The fallbacks answer for every route; they have no operation of their own.
    seen.insert(ErrorCode::UnknownRoute.as_str());
    seen.insert(ErrorCode::MethodNotAllowed.as_str());
    // A bug; not part of any route's contract.
    seen.insert(ErrorCode::Internal.as_str());
    let all: Vec<String> =
        serde_json::from_value(schema(&doc, "Error")["properties"]["error"]["enum"].clone())
            .expect("the Error schema lists codes");
    for code in &all {
        let parsed: ErrorCode = serde_json::from_value(json!(code)).expect("a known code");
        if !PARTICIPANT_ONLY.contains(&parsed) {
            assert!(
                seen.contains(parsed.as_str()),
                "{code} is answered by no documented route"
            );
        }
    }
    for code in &seen {
        assert!(
            all.iter().any(|c| c == code),
            "{code} is in the Error schema"
        );
    }
}

#[test]
fn every_limit_constant_is_the_number_the_document_states() {
    let doc = document();
    let id_param = &doc["components"]["parameters"]["Id"];
    let name_param = &doc["components"]["parameters"]["ParticipantName"];
    let lease_param = &doc["components"]["parameters"]["LeaseName"];
    let tx = &schema(&doc, "TransactionRequest")["properties"];
    let participants = &tx["participants"];
    let saga = &schema(&doc, "SagaRequest")["properties"];
    let step = &schema(&doc, "SagaStep")["properties"];
    let resolve_request = &schema(&doc, "ResolveRequest")["properties"];
    let acquire = &schema(&doc, "AcquireRequest")["properties"];
    let decision = operation(&doc, "get", protocol::routes::TRANSACTION_DECISION);
    let attempt = decision["parameters"]
        .as_array()
        .expect("parameters")
        .iter()
        .find(|p| p["name"] == "attempt")
        .expect("the attempt parameter");
    let limit_of = |method: &str, path: &str| {
        operation(&doc, method, path)["parameters"]
            .as_array()
            .expect("parameters")
            .iter()
            .find(|p| p["name"] == "limit")
            .expect("a limit parameter")["schema"]
            .clone()
    };

    let stated: Vec<(&str, u64, u64)> = vec![
        (
            "TXID_LEN_MAX: id path parameter",
            TXID_LEN_MAX as u64,
            number(&id_param["schema"]["maxLength"], "Id"),
        ),
        (
            "TXID_LEN_MAX: transaction id",
            TXID_LEN_MAX as u64,
            number(&tx["id"]["maxLength"], "id"),
        ),
        (
            "TXID_LEN_MAX: saga id",
            TXID_LEN_MAX as u64,
            number(&saga["id"]["maxLength"], "saga id"),
        ),
        (
            "step name: TXID_LEN_MAX / 2",
            (TXID_LEN_MAX / 2) as u64,
            number(&step["name"]["maxLength"], "step name"),
        ),
        (
            "NAME_LEN_MAX: participant name",
            NAME_LEN_MAX as u64,
            number(
                &participants["items"]["properties"]["name"]["maxLength"],
                "name",
            ),
        ),
        (
            "NAME_LEN_MAX: participant path parameter",
            NAME_LEN_MAX as u64,
            number(&name_param["schema"]["maxLength"], "name param"),
        ),
        (
            "NAME_LEN_MAX: saga step participant",
            NAME_LEN_MAX as u64,
            number(&step["participant"]["maxLength"], "step participant"),
        ),
        (
            "NAME_LEN_MAX: resolve participants",
            NAME_LEN_MAX as u64,
            number(
                &resolve_request["participants"]["items"]["maxLength"],
                "resolve participants",
            ),
        ),
        (
            "GTID_LEN_MAX: decision query",
            GTID_LEN_MAX as u64,
            number(
                &attempt["schema"]["properties"]["gtid"]["maxLength"],
                "gtid",
            ),
        ),
        (
            "GTID_LEN_MAX: resolve",
            GTID_LEN_MAX as u64,
            number(&resolve_request["gtid"]["maxLength"], "resolve gtid"),
        ),
        (
            "GTID_LEN_MAX: status",
            GTID_LEN_MAX as u64,
            number(
                &schema(&doc, "TransactionStatus")["properties"]["gtid"]["maxLength"],
                "status gtid",
            ),
        ),
        (
            "PARTICIPANTS_MAX",
            PARTICIPANTS_MAX as u64,
            number(&participants["maxItems"], "maxItems"),
        ),
        (
            "participants minItems",
            1,
            number(&participants["minItems"], "minItems"),
        ),
        (
            "PAYLOAD_BYTES_MAX: payload",
            PAYLOAD_BYTES_MAX as u64,
            number(
                &participants["items"]["properties"]["payload"]["x-payload-bytes-max"],
                "payload",
            ),
        ),
        (
            "PAYLOAD_BYTES_MAX: action",
            PAYLOAD_BYTES_MAX as u64,
            number(&step["action"]["x-payload-bytes-max"], "action"),
        ),
        (
            "PAYLOAD_BYTES_MAX: compensation",
            PAYLOAD_BYTES_MAX as u64,
            number(&step["compensation"]["x-payload-bytes-max"], "compensation"),
        ),
        (
            "TIMEOUT_MS_MIN",
            TIMEOUT_MS_MIN,
            number(&tx["timeout_ms"]["minimum"], "timeout minimum"),
        ),
        (
            "TIMEOUT_MS_MAX",
            TIMEOUT_MS_MAX,
            number(&tx["timeout_ms"]["maximum"], "timeout maximum"),
        ),
        (
            "REASON_LEN_MAX: a no vote's reason",
            REASON_LEN_MAX as u64,
            number(
                &schema(&doc, "TransactionResponse")["properties"]["reason"]["x-vote-reason-bytes-max"],
                "vote reason",
            ),
        ),
        (
            "LIST_LIMIT_MAX: transactions",
            LIST_LIMIT_MAX as u64,
            number(
                &limit_of("get", protocol::routes::TRANSACTIONS)["maximum"],
                "limit",
            ),
        ),
        (
            "LIST_LIMIT_MAX: sagas",
            LIST_LIMIT_MAX as u64,
            number(
                &limit_of("get", protocol::routes::SAGAS)["maximum"],
                "limit",
            ),
        ),
        (
            "LIST_LIMIT_MAX: audit",
            LIST_LIMIT_MAX as u64,
            number(
                &limit_of("get", protocol::routes::AUDIT)["maximum"],
                "limit",
            ),
        ),
        (
            "LIST_LIMIT_DEFAULT: transactions",
            LIST_LIMIT_DEFAULT as u64,
            number(
                &limit_of("get", protocol::routes::TRANSACTIONS)["default"],
                "limit",
            ),
        ),
        (
            "LIST_LIMIT_DEFAULT: sagas",
            LIST_LIMIT_DEFAULT as u64,
            number(
                &limit_of("get", protocol::routes::SAGAS)["default"],
                "limit",
            ),
        ),
        (
            "SAGA_STEPS_MAX",
            SAGA_STEPS_MAX as u64,
            number(&saga["steps"]["maxItems"], "steps"),
        ),
        (
            "SAGA_TIMEOUT_MS_MAX",
            SAGA_TIMEOUT_MS_MAX,
            number(&saga["timeout_ms"]["maximum"], "saga timeout"),
        ),
        (
            "SAGA_TIMEOUT_MS_DEFAULT",
            SAGA_TIMEOUT_MS_DEFAULT,
            number(&saga["timeout_ms"]["default"], "saga timeout default"),
        ),
        (
            "LEASE_NAME_LEN_MAX: path",
            LEASE_NAME_LEN_MAX as u64,
            number(&lease_param["schema"]["maxLength"], "lease name"),
        ),
        (
            "LEASE_NAME_LEN_MAX: holder",
            LEASE_NAME_LEN_MAX as u64,
            number(&acquire["holder"]["maxLength"], "holder"),
        ),
        (
            "LEASE_TTL_MS_MAX",
            LEASE_TTL_MS_MAX,
            number(&acquire["ttl_ms"]["maximum"], "ttl"),
        ),
        (
            "LEASE_TTL_MS_DEFAULT",
            LEASE_TTL_MS_DEFAULT,
            number(&acquire["ttl_ms"]["default"], "ttl default"),
        ),
        (
            "LEASE_TTL_MS_MIN",
            LEASE_TTL_MS_MIN,
            number(&acquire["ttl_ms"]["x-ttl-ms-min"], "ttl min"),
        ),
    ];
    for (what, constant, in_document) in stated {
        assert_eq!(constant, in_document, "{what}");
    }
    for name in ["ResolveRequest", "RetryRequest", "SagaResolveRequest"] {
        let fields = &schema(&doc, name)["properties"];
        assert_eq!(
            number(&fields["operator"]["maxLength"], name),
            OPERATOR_LEN_MAX as u64,
            "{name}"
        );
        assert_eq!(
            number(&fields["reason"]["maxLength"], name),
            OPERATOR_REASON_LEN_MAX as u64,
            "{name}"
        );
        assert_eq!(number(&fields["operator"]["minLength"], name), 1, "{name}");
    }
    // Every request body states the body limit.
    for (method, path, operation) in operations(&doc) {
        if let Some(body) = operation.get("requestBody") {
            // A group's replication carries whole log segments: its own, larger limit.
            let limit = if path.starts_with("/v1/replica/") {
                super::replica::REPLICA_BODY_MAX
            } else {
                BODY_BYTES_MAX
            };
            assert_eq!(
                number(&body["x-body-bytes-max"], "x-body-bytes-max"),
                limit as u64,
                "{method} {path}"
            );
        }
    }
}

/// The characters of the id rules: what `^...[class]*$` allows, spelled out.
fn id_class(pattern: &str) -> BTreeSet<char> {
    let class = pattern
        .strip_suffix("]*$")
        .and_then(|p| p.rsplit_once('['))
        .map(|(_, class)| class)
        .unwrap_or_else(|| panic!("{pattern} ends with a character class"));
    let chars: Vec<char> = class.chars().collect();
    let mut allowed = BTreeSet::new();
    let mut i = 0;
    while i < chars.len() {
        if i + 2 < chars.len() && chars[i + 1] == '-' {
            allowed.extend(chars[i]..=chars[i + 2]);
            i += 3;
        } else {
            allowed.insert(chars[i]);
            i += 1;
        }
    }
    allowed
}

#[test]
fn the_id_pattern_allows_exactly_the_characters_the_id_rules_allow() {
    let doc = document();
    let pattern = doc["components"]["parameters"]["Id"]["schema"]["pattern"]
        .as_str()
        .expect("a pattern")
        .to_string();
    let allowed = id_class(&pattern);
    for c in (0u8..128).map(char::from).chain(['é', 'ß', '∞']) {
        let id = format!("a{c}b");
        assert_eq!(
            TxId::new(&id).is_ok(),
            allowed.contains(&c),
            "{c:?}: the id rules and the pattern {pattern} disagree"
        );
    }
    // Every id-like field uses the same pattern, and lengths are stated with it.
    let mut uses = BTreeMap::new();
    for (method, path, operation) in operations(&doc) {
        for parameter in operation["parameters"].as_array().into_iter().flatten() {
            let parameter = resolve(&doc, parameter);
            if let Some(p) = parameter["schema"]["pattern"].as_str() {
                uses.insert(
                    format!("{method} {path} {}", parameter["name"]),
                    p.to_string(),
                );
            }
        }
    }
    for (name, field) in [
        ("TransactionRequest", "id"),
        ("SagaRequest", "id"),
        ("AcquireRequest", "holder"),
        ("RenewRequest", "holder"),
        ("ResolveRequest", "gtid"),
    ] {
        let p = schema(&doc, name)["properties"][field]["pattern"]
            .as_str()
            .unwrap_or_else(|| panic!("{name}.{field} has a pattern"));
        uses.insert(format!("{name}.{field}"), p.to_string());
    }
    // Participant names, the example: an empty one was schema-valid and refused.
    let names = [
        (
            "TransactionRequest participant name",
            &schema(&doc, "TransactionRequest")["properties"]["participants"]["items"]["properties"]
                ["name"],
        ),
        (
            "SagaStep participant",
            &schema(&doc, "SagaStep")["properties"]["participant"],
        ),
        (
            "ResolveRequest participants",
            &schema(&doc, "ResolveRequest")["properties"]["participants"]["items"],
        ),
    ];
    for (what, field) in names {
        assert_eq!(field["minLength"], 1, "{what}");
        let p = field["pattern"]
            .as_str()
            .unwrap_or_else(|| panic!("{what} has a pattern"));
        uses.insert(what.to_string(), p.to_string());
    }
    uses.retain(|use_, _| !use_.contains("\"after\""));
    assert!(uses.len() > 10, "{uses:?}");
    for (use_, p) in uses {
        assert_eq!(p, pattern, "{use_}");
    }
    // Step names are ids without ':'.
    let step = schema(&doc, "SagaStep")["properties"]["name"]["pattern"]
        .as_str()
        .expect("a step name pattern");
    let mut without_colon = allowed.clone();
    without_colon.remove(&':');
    assert_eq!(id_class(step), without_colon);
}
