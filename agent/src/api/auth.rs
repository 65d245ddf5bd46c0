//! Who the caller is, and whether a route lets it through.
//!
//! Three scopes, each above the one before: `read` (`/v1/status`,
//! `/v1/events`), `task` (register tasks, end its own), `admin` (everything:
//! reset a worker, end anyone's task). A caller is known by a bearer token
//! of a scope (`token:admin`, `token:task`, `token:read`), by its uid on
//! the local socket (`uid:0` is admin, any other uid has `task`), or, on an
//! agent with no token at all, is `anonymous`: every route, as before
//! scopes, but it ends only its own tasks. `/live`, `/ready`, `/health` and
//! `/metrics` are open to all and never pass here.

use std::{net::SocketAddr, sync::Arc};

use axum::{
    Json,
    extract::{Request, State},
    http::{HeaderValue, StatusCode, header},
    middleware::Next,
    response::{IntoResponse, Response},
};
use subtle::ConstantTimeEq as _;

use crate::model::{process::SeenProcess, spec::ANONYMOUS};

/// What a caller may do; each scope includes those below it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Scope {
    Read,
    Task,
    Admin,
}

impl Scope {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Scope::Read => "read",
            Scope::Task => "task",
            Scope::Admin => "admin",
        }
    }
}

/// The configured tokens, one per scope (`api_token` is admin's).
#[derive(Clone, Debug, Default)]
pub(crate) struct Tokens {
    pub admin: Option<Arc<str>>,
    pub task: Option<Arc<str>>,
    pub read: Option<Arc<str>>,
}

impl Tokens {
    pub(crate) fn new(admin: Option<&str>, task: Option<&str>, read: Option<&str>) -> Self {
        Self {
            admin: admin.map(Arc::from),
            task: task.map(Arc::from),
            read: read.map(Arc::from),
        }
    }

    fn any(&self) -> bool {
        self.admin.is_some() || self.task.is_some() || self.read.is_some()
    }

    /// The scope of `given`, compared with every configured token in
    /// constant time (none is skipped when an earlier one matched).
    fn scope_of(&self, given: &str) -> Option<Scope> {
        let mut found = None;
        for (token, scope) in [
            (&self.read, Scope::Read),
            (&self.task, Scope::Task),
            (&self.admin, Scope::Admin),
        ] {
            if let Some(token) = token
                && bool::from(given.as_bytes().ct_eq(token.as_bytes()))
            {
                found = Some(scope);
            }
        }
        found
    }
}

/// How a connection reached the agent: set on every request by the accept
/// loop (serve.rs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Peer {
    Tcp(SocketAddr),
    /// The local socket, with the peer's credentials (SO_PEERCRED); its
    /// pid with the instant the connection was accepted.
    Unix {
        uid: u32,
        pid: Option<SeenProcess>,
    },
}

/// The caller a guarded route sees (a request extension).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Caller {
    /// `token:<scope>`, `uid:<uid>` or `anonymous`: the owner of the tasks
    /// it registers.
    pub principal: String,
    pub scope: Scope,
    /// May end tasks other principals registered (admins only).
    pub any_owner: bool,
    /// The uid the kernel gave for a caller on the socket (no token).
    pub uid: Option<u32>,
}

impl Caller {
    fn admin(principal: String, uid: u32) -> Self {
        Self {
            principal,
            scope: Scope::Admin,
            any_owner: true,
            uid: Some(uid),
        }
    }
}

/// What a guarded route needs (the state of its middleware).
#[derive(Clone)]
pub(super) struct Guard {
    pub tokens: Tokens,
    /// The uid the agent runs as: admin on the socket, as root is.
    pub agent_uid: u32,
    pub needs: Scope,
}

/// Lets the request through, with its [`Caller`], when the caller has the
/// route's scope; 401 (`WWW-Authenticate: Bearer`) when it is not known or
/// its token is wrong, 403 naming the scope when it has a lower one.
pub(super) async fn guard(
    State(guard): State<Guard>,
    mut request: Request,
    next: Next,
) -> Response {
    let Some(caller) = identify(&guard.tokens, guard.agent_uid, &request) else {
        return unauthorized(guard.needs);
    };
    if caller.scope < guard.needs {
        let needs = guard.needs.as_str();
        let hint = if caller.principal == ANONYMOUS {
            " (over TCP, changes need a token: call on the agent's local socket, \
             where your uid is known, or send `Authorization: Bearer <token>`)"
        } else {
            ""
        };
        return (
            StatusCode::FORBIDDEN,
            Json(serde_json::json!({
                "error": format!(
                    "this route needs the `{needs}` scope; {} has `{}`{hint}",
                    caller.principal,
                    caller.scope.as_str()
                ),
                "scope": needs,
            })),
        )
            .into_response();
    }
    request.extensions_mut().insert(caller);
    next.run(request).await
}

/// The caller: a bearer token when one is sent to an agent with tokens,
/// else the socket peer's uid (root and `agent_uid` are admin), else
/// `anonymous` (read only) when the agent has no token. `None`: nobody (a
/// token is needed, or the one sent is wrong).
fn identify(tokens: &Tokens, agent_uid: u32, request: &Request) -> Option<Caller> {
    let authorization = request.headers().get(header::AUTHORIZATION);
    if tokens.any()
        && let Some(value) = authorization
    {
        let given = value.to_str().ok().and_then(|v| v.strip_prefix("Bearer "));
        let scope = given.and_then(|token| tokens.scope_of(token))?;
        return Some(Caller {
            principal: format!("token:{}", scope.as_str()),
            scope,
            any_owner: scope == Scope::Admin,
            uid: None,
        });
    }
    match request.extensions().get::<Peer>() {
        Some(Peer::Unix { uid, .. }) if *uid == 0 || *uid == agent_uid => {
            Some(Caller::admin(format!("uid:{uid}"), *uid))
        }
        Some(Peer::Unix { uid, .. }) => Some(Caller {
            principal: format!("uid:{uid}"),
            scope: Scope::Task,
            any_owner: false,
            uid: Some(*uid),
        }),
        Some(Peer::Tcp(_)) | None if tokens.any() => None,
        // No token configured: TCP reads, and changes nothing. Every
        // local user reaches 127.0.0.1, and the kernel does not say which
        // one called; the socket does.
        Some(Peer::Tcp(_)) | None => Some(Caller {
            principal: ANONYMOUS.into(),
            scope: Scope::Read,
            any_owner: false,
            uid: None,
        }),
    }
}

fn unauthorized(needs: Scope) -> Response {
    let mut response = (
        StatusCode::UNAUTHORIZED,
        Json(serde_json::json!({
            "error": format!(
                "this route needs `Authorization: Bearer <token>` with a token of the `{}` \
                 scope or above (the agent's read_token_file, task_token_file or api_token), \
                 or a call on the agent's local socket",
                needs.as_str()
            ),
            "scope": needs.as_str(),
        })),
    )
        .into_response();
    response
        .headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    response
}
