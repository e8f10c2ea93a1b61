//! `POST /convert` over TLS: every replica (leader or not) answers the
//! API server's ConversionReviews with the rule set in force
//! ([`crate::conversion::review`]). A review changes nothing anywhere.

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::tls::{Swappable, server_config};
use crate::rules::RuleSet;

/// The largest review body taken: the API server sends objects of at most
/// about 3 MiB, and a list of them when it converts a list.
const MAX_BODY: usize = 64 * 1024 * 1024;

#[derive(Clone)]
struct Convert {
    sets: watch::Receiver<Option<Arc<RuleSet>>>,
    metrics: Arc<crate::telemetry::Metrics>,
}

/// Serves `/convert` on `listener` until `shutdown`.
pub async fn serve(
    listener: TcpListener,
    cert: Arc<Swappable>,
    sets: watch::Receiver<Option<Arc<RuleSet>>>,
    metrics: Arc<crate::telemetry::Metrics>,
    shutdown: CancellationToken,
) {
    let app = Router::new()
        .route("/convert", post(convert))
        .layer(DefaultBodyLimit::max(MAX_BODY))
        .with_state(Convert { sets, metrics });
    let acceptor = TlsAcceptor::from(server_config(cert));
    loop {
        let (tcp, peer) = tokio::select! {
            _ = shutdown.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    warn!("conversion webhook: accepting a connection: {e}");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let (acceptor, app, shutdown) = (acceptor.clone(), app.clone(), shutdown.clone());
        tokio::spawn(async move {
            let tls = match acceptor.accept(tcp).await {
                Ok(tls) => tls,
                Err(e) => {
                    debug!(%peer, "conversion webhook: TLS handshake failed: {e}");
                    return;
                }
            };
            let builder = auto::Builder::new(TokioExecutor::new());
            let connection =
                builder.serve_connection(TokioIo::new(tls), TowerToHyperService::new(app));
            tokio::select! {
                _ = shutdown.cancelled() => {}
                served = connection => if let Err(e) = served {
                    debug!(%peer, "conversion webhook: connection ended: {e}");
                },
            }
        });
    }
}

async fn convert(State(state): State<Convert>, body: Bytes) -> Response {
    let review: serde_json::Value = match serde_json::from_slice(&body) {
        Ok(review) => review,
        Err(e) => {
            return (
                StatusCode::BAD_REQUEST,
                format!("not a ConversionReview: {e}"),
            )
                .into_response();
        }
    };
    let set = state.sets.borrow().clone().unwrap_or_default();
    let answer = crate::conversion::review(&set, &review);
    let status = answer
        .pointer("/response/result/status")
        .and_then(serde_json::Value::as_str)
        .unwrap_or("Failure");
    state
        .metrics
        .conversion_reviews
        .get_or_create(&crate::telemetry::OutcomeLabel {
            result: if status == "Success" { "ok" } else { "failed" }.to_owned(),
        })
        .inc();
    if status != "Success" {
        warn!(
            "conversion webhook: {}",
            answer
                .pointer("/response/result/message")
                .and_then(serde_json::Value::as_str)
                .unwrap_or_default()
        );
    }
    axum::Json(answer).into_response()
}
