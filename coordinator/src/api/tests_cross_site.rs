//! The cross-site rules through the coordinator's router (issue 24 item 5): a form POST from
//! another site is refused before anything is audited, a non-JSON write is 415, the UI's own
//! JSON call works, and a loopback coordinator without tokens answers only loopback `Host`
//! names, while one with tokens answers any.

use axum::Router;
use axum::body::Body;
use axum::http::{Request, StatusCode, header};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

use super::ROUTES;
use super::tests::ready_router;

const RETRY: &str = "/v1/participants/inventory/retry";

async fn send(app: &Router, request: Request<Body>) -> (StatusCode, Value) {
    let response = app.clone().oneshot(request).await.unwrap();
    let status = response.status();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (
        status,
        serde_json::from_slice(&bytes).unwrap_or(Value::Null),
    )
}

async fn audited(app: &Router) -> usize {
    let request = Request::get("/v1/audit").body(Body::empty()).unwrap();
    let (status, body) = send(app, request).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body["audit"].as_array().map_or(0, Vec::len)
}

#[tokio::test]
async fn a_form_post_from_another_site_is_refused_and_not_audited() {
    let (app, _dir) = ready_router().await;
    let form = Request::post(RETRY)
        .header(header::HOST, "127.0.0.1:7100")
        .header(header::ORIGIN, "https://evil.example")
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
        .body(Body::empty())
        .unwrap();
    let (status, body) = send(&app, form).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(body["error"], "forbidden_origin");
    assert_eq!(audited(&app).await, 0);

    // The same form from a page without Origin (an old browser): its content type gives it away.
    for content_type in ["application/x-www-form-urlencoded", "text/plain"] {
        let request = Request::post(RETRY)
            .header(header::CONTENT_TYPE, content_type)
            .body(Body::from("operator=x&reason=y"))
            .unwrap();
        let (status, body) = send(&app, request).await;
        assert_eq!(status, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{content_type}");
        assert_eq!(body["error"], "unsupported_media_type");
    }
    let untyped = Request::post(RETRY).body(Body::from("{}")).unwrap();
    assert_eq!(
        send(&app, untyped).await.0,
        StatusCode::UNSUPPORTED_MEDIA_TYPE
    );
    assert_eq!(audited(&app).await, 0);

    // What the UI sends: same origin, JSON.
    let own = Request::post(RETRY)
        .header(header::HOST, "127.0.0.1:7100")
        .header(header::ORIGIN, "http://127.0.0.1:7100")
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(json!({"reason": "ui"}).to_string()))
        .unwrap();
    let (status, body) = send(&app, own).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(audited(&app).await, 1);
}

#[tokio::test]
async fn a_loopback_coordinator_without_tokens_answers_only_loopback_names() {
    let (app, _dir) = ready_router().await;
    for (method, path) in ROUTES {
        let uri = path.replace("{id}", "t-1").replace("{name}", "inventory");
        let request = Request::builder()
            .method(method.to_ascii_uppercase().as_str())
            .uri(&uri)
            .header(header::HOST, "evil.example:7100")
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(if *method == "get" { "" } else { "{}" }))
            .unwrap();
        let (status, body) = send(&app, request).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{method} {uri}: {body}");
        assert_eq!(body["error"], "forbidden_host", "{method} {uri}");
    }
    for host in ["localhost:7100", "127.0.0.1:7100", "[::1]:7100"] {
        let request = Request::get("/v1/cluster")
            .header(header::HOST, host)
            .body(Body::empty())
            .unwrap();
        assert_eq!(send(&app, request).await.0, StatusCode::OK, "{host}");
    }
}
