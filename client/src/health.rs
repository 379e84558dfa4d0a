//! The `health` reply and the protocol check made on connect.

use serde_json::Value;
use tessera_proto::consts::HEALTH_STATUS_SERVING;

use crate::error::ClientError;

/// Flight protocol versions this client speaks.
pub const SUPPORTED_PROTOCOLS: [u32; 2] = [2, 3];

/// What a server's `health` action said.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerHealth {
    /// The `protocol` key as a number; `None` when it is missing, not a
    /// number, or the reply stream was empty.
    pub protocol: Option<u32>,
    /// `status` (`"SERVING"` when the key is missing, `"UNKNOWN"` for an
    /// empty reply stream).
    pub status: String,
    /// The whole reply (`null` for an empty stream, `{}` for a non-JSON body).
    pub json: Value,
}

impl ServerHealth {
    /// Parses the first result body of `health` (`None`: empty stream).
    pub(crate) fn from_body(body: Option<&[u8]>) -> ServerHealth {
        let Some(body) = body else {
            return ServerHealth {
                protocol: None,
                status: "UNKNOWN".to_string(),
                json: Value::Null,
            };
        };
        let json: Value = serde_json::from_slice(body)
            .ok()
            .filter(Value::is_object)
            .unwrap_or_else(|| Value::Object(Default::default()));
        let protocol = match json.get("protocol") {
            Some(Value::Number(n)) => n.as_u64().and_then(|v| u32::try_from(v).ok()),
            Some(Value::String(s)) => s.trim().parse().ok(),
            _ => None,
        };
        let status = json
            .get("status")
            .and_then(Value::as_str)
            .unwrap_or(HEALTH_STATUS_SERVING)
            .to_string();
        ServerHealth {
            protocol,
            status,
            json,
        }
    }

    /// Refuses a server whose protocol is not 2 or 3. Like biopb, an empty
    /// reply passes and a reply without `protocol` counts as protocol 1.
    pub(crate) fn check_protocol(&self, location: &str) -> Result<(), ClientError> {
        if self.json.is_null() {
            return Ok(());
        }
        if self
            .protocol
            .is_some_and(|p| SUPPORTED_PROTOCOLS.contains(&p))
        {
            return Ok(());
        }
        let found = match self.json.get("protocol") {
            None => "1 (its health reply has no 'protocol' key)".to_string(),
            Some(value) => value.to_string(),
        };
        Err(ClientError::IncompatibleProtocol {
            location: location.to_string(),
            found,
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn protocols_two_and_three_pass() {
        for body in [
            &br#"{"protocol": 3, "status": "SERVING"}"#[..],
            br#"{"protocol": "2"}"#,
        ] {
            let health = ServerHealth::from_body(Some(body));
            health.check_protocol("grpc://x:1").unwrap();
            assert_eq!(health.status, "SERVING");
        }
        ServerHealth::from_body(None)
            .check_protocol("grpc://x:1")
            .unwrap();
    }

    #[test]
    fn other_protocols_are_refused_saying_what_was_found() {
        for (body, needle) in [
            (
                &br#"{"status": "SERVING"}"#[..],
                "protocol 1 (its health reply has no 'protocol' key)",
            ),
            (b"not json", "no 'protocol' key"),
            (br#"{"protocol": 4}"#, "protocol 4,"),
            (br#"{"protocol": "v9"}"#, "protocol \"v9\""),
        ] {
            let err = ServerHealth::from_body(Some(body))
                .check_protocol("grpc://x:1")
                .unwrap_err()
                .to_string();
            assert!(err.contains(needle), "{err}");
            assert!(err.contains("grpc://x:1"), "{err}");
        }
    }
}
