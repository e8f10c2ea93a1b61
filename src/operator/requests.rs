//! Every request the operator sends, counted by verb, resource and cluster
//! (`trellis_api_requests_total`): the client is wrapped once (the hub's,
//! `cluster="local"`, and each spoke's, by its name), so no call site can
//! forget to count, and a test or a benchmark reads the operator's own
//! traffic without the API server's metrics.

use std::sync::Arc;

use http::{Method, Request};
use kube::Client;
use kube::client::Body;

use crate::telemetry::Metrics;

/// `client` (the hub's), counting each request it sends into `metrics`.
pub fn counted(client: Client, metrics: Arc<Metrics>) -> Client {
    counted_in(client, metrics, crate::clusters::LOCAL)
}

/// [`counted`], for the client of the cluster `cluster` (a spoke's name).
pub fn counted_in(client: Client, metrics: Arc<Metrics>, cluster: &str) -> Client {
    let namespace = client.default_namespace().to_owned();
    let valid_until = *client.valid_until();
    let cluster = cluster.to_owned();
    let service = tower::service_fn(move |request: Request<Body>| {
        let (verb, resource) = classify(&request);
        metrics.api_request(verb, &resource, &cluster);
        let inner = client.clone();
        async move { inner.send(request).await }
    });
    Client::new(service, namespace).with_valid_until(valid_until)
}

/// The Kubernetes verb and the resource (`configmaps`, `apps/deployments`,
/// `widgets.example.com/status`) of a request.
fn classify<B>(request: &Request<B>) -> (&'static str, String) {
    let uri = request.uri();
    let query = uri.query().unwrap_or_default();
    let (resource, named) = resource_of(uri.path());
    let apply = request
        .headers()
        .get(http::header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/apply-patch"));
    let verb = match *request.method() {
        Method::GET if resource == "discovery" => "get",
        Method::GET
            if query
                .split('&')
                .any(|kv| kv == "watch=true" || kv == "watch=1") =>
        {
            "watch"
        }
        Method::GET if named => "get",
        Method::GET => "list",
        Method::POST => "create",
        Method::PATCH if apply => "apply",
        Method::PATCH => "patch",
        Method::PUT => "update",
        Method::DELETE if named => "delete",
        Method::DELETE => "deletecollection",
        _ => "other",
    };
    (verb, resource)
}

/// `group/resource[/subresource]` of an API path, and whether it names one
/// object; paths outside `/api` and `/apis` (discovery, `/version`) are
/// `discovery`.
fn resource_of(path: &str) -> (String, bool) {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    match parts.as_slice() {
        ["api", _version, rest @ ..] => with_group("", rest),
        ["apis", group, _version, rest @ ..] => with_group(group, rest),
        _ => ("discovery".to_owned(), false),
    }
}

fn with_group(group: &str, rest: &[&str]) -> (String, bool) {
    // `namespaces/NS/<resource>…` is namespaced; `namespaces` alone (or
    // `namespaces/NS`) is the namespace resource itself.
    let rest = match rest {
        ["namespaces", _ns, tail @ ..] if !tail.is_empty() => tail,
        other => other,
    };
    let (resource, named, sub) = match rest {
        [] => return ("discovery".to_owned(), false),
        [resource] => (*resource, false, None),
        [resource, _name] => (*resource, true, None),
        [resource, _name, sub, ..] => (*resource, true, Some(*sub)),
    };
    let mut out = if group.is_empty() {
        resource.to_owned()
    } else {
        format!("{group}/{resource}")
    };
    if let Some(sub) = sub {
        out.push('/');
        out.push_str(sub);
    }
    (out, named)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verb(method: Method, uri: &str, content_type: Option<&str>) -> (&'static str, String) {
        let mut b = Request::builder().method(method).uri(uri);
        if let Some(ct) = content_type {
            b = b.header(http::header::CONTENT_TYPE, ct);
        }
        classify(&b.body(()).unwrap())
    }

    #[test]
    fn names_the_verb_and_resource_of_each_request() {
        let cases = [
            (
                verb(Method::GET, "/api/v1/namespaces/a/configmaps/x", None),
                ("get", "configmaps"),
            ),
            (
                verb(
                    Method::GET,
                    "/api/v1/namespaces/a/configmaps?labelSelector=l",
                    None,
                ),
                ("list", "configmaps"),
            ),
            (
                verb(
                    Method::GET,
                    "/apis/apps/v1/deployments?watch=true&resourceVersion=1",
                    None,
                ),
                ("watch", "apps/deployments"),
            ),
            (
                verb(
                    Method::PATCH,
                    "/apis/apps/v1/namespaces/a/deployments/d?fieldManager=t",
                    Some("application/apply-patch+yaml"),
                ),
                ("apply", "apps/deployments"),
            ),
            (
                verb(
                    Method::PATCH,
                    "/apis/example.com/v1/namespaces/a/widgets/w/status",
                    Some("application/merge-patch+json"),
                ),
                ("patch", "example.com/widgets/status"),
            ),
            (
                verb(
                    Method::POST,
                    "/apis/events.k8s.io/v1/namespaces/a/events",
                    None,
                ),
                ("create", "events.k8s.io/events"),
            ),
            (
                verb(Method::DELETE, "/api/v1/namespaces/a/services/s", None),
                ("delete", "services"),
            ),
            (
                verb(Method::GET, "/api/v1/namespaces/a", None),
                ("get", "namespaces"),
            ),
            (
                verb(Method::GET, "/apis/apps/v1", None),
                ("get", "discovery"),
            ),
            (verb(Method::GET, "/version", None), ("get", "discovery")),
        ];
        for ((verb, resource), (want_verb, want_resource)) in cases {
            assert_eq!((verb, resource.as_str()), (want_verb, want_resource));
        }
    }
}
