//! What a pass fails with: a type until it becomes the message on the
//! parent's condition, its Event and the log; whether the API server was
//! at fault (an outage: nothing the parent can fix) is read from it.

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Plan(String),
    #[error("applying {key}: {}", brief(source))]
    Apply {
        key: String,
        #[source]
        source: kube::Error,
    },
    #[error("deleting {key}: {}", brief(source))]
    Delete {
        key: String,
        #[source]
        source: kube::Error,
    },
    #[error(
        "{key} already exists and belongs to {owner}; it is not taken over: give the child a name of its own"
    )]
    Conflict { key: String, owner: String },
    /// A field of a patch target another manager owns (the API server's
    /// message names manager and field); the target was not written.
    #[error("patching {key}: {message}")]
    PatchConflict { key: String, message: String },
    #[error("writing status: {}", brief(.0))]
    Status(#[source] kube::Error),
    #[error("updating finalizers: {}", brief(.0))]
    Finalizer(#[source] kube::Error),
    /// The gate closed (leadership lost or shutdown): the pass stops writing.
    #[error(transparent)]
    NotLeader(#[from] crate::operator::leadership::leader::NotLeader),
    /// A child write the rule's account may not make (403), by
    /// [`crate::operator::identity::refusal`]: account, verb, resource, namespace.
    #[error("{doing} {key}: {refusal}")]
    Denied {
        doing: &'static str,
        key: String,
        refusal: String,
        #[source]
        source: kube::Error,
    },
}

impl Error {
    /// The request got no HTTP answer (connection refused, reset, timeout).
    pub(in crate::operator) fn is_transport(&self) -> bool {
        self.kube_error()
            .is_some_and(|e| !matches!(e, kube::Error::Api(_)))
    }

    /// The API server could not serve the request: no answer, or a 5xx
    /// or 429 (its etcd gone, overloaded). Nothing the parent can fix.
    pub(in crate::operator) fn is_outage(&self) -> bool {
        match self.kube_error() {
            Some(kube::Error::Api(status)) => status.code >= 500 || status.code == 429,
            Some(_) => true,
            None => false,
        }
    }

    pub(in crate::operator) fn kube_error(&self) -> Option<&kube::Error> {
        match self {
            Error::Apply { source, .. }
            | Error::Delete { source, .. }
            | Error::Denied { source, .. } => Some(source),
            Error::Status(e) | Error::Finalizer(e) => Some(e),
            _ => None,
        }
    }
}

/// The API server's own message, without the debug dump around it.
fn brief(err: &kube::Error) -> String {
    match err {
        kube::Error::Api(status) => format!("{} ({})", status.message, status.code),
        other => other.to_string(),
    }
}
