//! `[[otlp]]`: every event as an OpenTelemetry log record, to an OTLP
//! receiver (a Collector) over gRPC or HTTP (protobuf).

use std::{collections::BTreeMap, path::Path};

use serde::Deserialize;

use crate::sinks::config::{Delivery, InvalidKey, Secret, SinkTable, parse_url};

/// The path OTLP/HTTP takes logs at, added to an `endpoint` that has none.
pub(crate) const HTTP_LOGS_PATH: &str = "/v1/logs";

/// How records travel (`protocol = "grpc" | "http"`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OtlpProtocol {
    /// OTLP/gRPC: `LogsService/Export` over HTTP/2 (a Collector's port 4317).
    Grpc,
    /// OTLP/HTTP with a protobuf body: `POST /v1/logs` (port 4318). The
    /// default, as the OTLP exporter specification makes it.
    #[default]
    Http,
}

impl OtlpProtocol {
    /// The values the `protocol` key takes.
    pub(crate) const NAMES: [&str; 2] = ["grpc", "http"];

    fn parse(text: &str) -> Option<Self> {
        match text {
            "grpc" => Some(Self::Grpc),
            "http" | "http/protobuf" => Some(Self::Http),
            _ => None,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OtlpConfig {
    /// Label on metrics and key of the sink's cursor: keep it stable.
    pub name: String,
    /// gRPC: the server (`http://collector:4317`, a path is ignored);
    /// HTTP: the full URL records are posted to (`/v1/logs` added when
    /// the endpoint has no path).
    pub endpoint: reqwest::Url,
    pub protocol: OtlpProtocol,
    /// Sent with every request (gRPC metadata, HTTP headers): read from
    /// `headers_file` at start, never written in the config itself.
    pub headers: Vec<(String, Secret)>,
    /// More resource attributes (`deployment.environment.name`, …).
    pub resource: BTreeMap<String, String>,
    pub delivery: Delivery,
}

/// The keys of `[[otlp]]` besides the delivery keys.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct OtlpFile {
    endpoint: String,
    name: Option<String>,
    protocol: Option<String>,
    headers_file: Option<String>,
    resource_attributes: Option<BTreeMap<String, String>>,
}

impl OtlpConfig {
    pub fn from_table(mut table: SinkTable) -> Result<Self, InvalidKey> {
        let delivery = table.delivery(Delivery::default(), true)?;
        let file: OtlpFile = table.rest()?;
        let protocol = match file.protocol.as_deref() {
            None => OtlpProtocol::default(),
            Some(text) => OtlpProtocol::parse(text).ok_or_else(|| {
                table.invalid(
                    "protocol",
                    format!(
                        "is `{text}`: must be one of {}",
                        OtlpProtocol::NAMES.map(|n| format!("\"{n}\"")).join(", ")
                    ),
                )
            })?,
        };
        let endpoint = endpoint(&table, &file.endpoint, protocol)?;
        let headers = match &file.headers_file {
            None => Vec::new(),
            Some(path) => headers_file(Path::new(path))
                .map_err(|problem| table.invalid("headers_file", problem))?,
        };
        let resource = file.resource_attributes.unwrap_or_default();
        if let Some(key) = resource.keys().find(|k| k.trim().is_empty()) {
            return Err(table.invalid(
                "resource_attributes",
                format!("has an empty attribute name: {key:?}"),
            ));
        }
        Ok(Self {
            name: file.name.unwrap_or_else(|| table.default_name()),
            endpoint,
            protocol,
            headers,
            resource,
            delivery,
        })
    }
}

/// `text` as the endpoint of `protocol`: an http or https URL with a host;
/// for HTTP, `/v1/logs` when it names no path.
fn endpoint(
    table: &SinkTable,
    text: &str,
    protocol: OtlpProtocol,
) -> Result<reqwest::Url, InvalidKey> {
    let mut url = parse_url(&table.key("endpoint"), text)?;
    if url.host_str().is_none_or(str::is_empty) {
        return Err(table.invalid("endpoint", format!("names no host: {text:?}")));
    }
    if protocol == OtlpProtocol::Http && url.path() == "/" {
        url.set_path(HTTP_LOGS_PATH);
    }
    Ok(url)
}

/// The headers in the file at `path`: one `name: value` per line (blank
/// lines and lines starting with `#` skipped). Refused, as the agent's
/// token files are, when group or others may read it or another user owns
/// it: it holds secrets (API keys, bearer tokens).
pub(crate) fn headers_file(path: &Path) -> Result<Vec<(String, Secret)>, String> {
    let text = crate::model::secret_file::read_private(path)?;
    parse_headers(&text).map_err(|problem| format!("{}: {problem}", path.display()))
}

/// `name: value` lines as headers; the problem names the line.
fn parse_headers(text: &str) -> Result<Vec<(String, Secret)>, String> {
    let mut headers = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((name, value)) = line.split_once(':') else {
            return Err(format!("line {}: not `name: value`", number + 1));
        };
        let (name, value) = (name.trim().to_ascii_lowercase(), value.trim());
        let valid_name = !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b));
        if !valid_name {
            return Err(format!(
                "line {}: {name:?} is not a header name",
                number + 1
            ));
        }
        if value.is_empty() || value.bytes().any(|b| b.is_ascii_control()) {
            return Err(format!(
                "line {}: the value of {name} is empty or holds control characters",
                number + 1
            ));
        }
        headers.push((name, Secret(value.to_string())));
    }
    Ok(headers)
}

#[cfg(test)]
mod tests {
    use std::{fs, os::unix::fs::PermissionsExt as _};

    use super::*;
    use crate::sinks::config::table;

    fn read(text: &str) -> Result<OtlpConfig, InvalidKey> {
        OtlpConfig::from_table(table("otlp", text))
    }

    #[test]
    fn defaults_are_http_to_v1_logs() {
        let c = read("endpoint = \"http://127.0.0.1:4318\"").unwrap();
        assert_eq!(c.name, "otlp-1");
        assert_eq!(c.protocol, OtlpProtocol::Http);
        assert_eq!(c.endpoint.as_str(), "http://127.0.0.1:4318/v1/logs");
        assert!(c.headers.is_empty());
        assert_eq!(c.delivery, Delivery::default());
        let c = read("endpoint = \"https://otel.example:443/custom/logs\"").unwrap();
        assert_eq!(c.endpoint.path(), "/custom/logs", "a path given is kept");
        let c = read(
            "endpoint = \"http://c:4317\"\nprotocol = \"grpc\"\nname = \"col\"\ntimeout = \"3s\"\n\
             batch_size = 7\n[resource_attributes]\n\"deployment.environment.name\" = \"prod\"",
        )
        .unwrap();
        assert_eq!(c.protocol, OtlpProtocol::Grpc);
        assert_eq!(c.endpoint.as_str(), "http://c:4317/", "gRPC: no path added");
        assert_eq!(c.name, "col");
        assert_eq!(c.delivery.timeout, std::time::Duration::from_secs(3));
        assert_eq!(c.delivery.batch_size, 7);
        assert_eq!(c.resource["deployment.environment.name"], "prod");
    }

    #[test]
    fn bad_values_name_their_key() {
        for (text, key, needle) in [
            (
                "endpoint = \"ftp://c:21\"",
                "otlp[0].endpoint",
                "http or https",
            ),
            (
                "endpoint = \"not a url\"",
                "otlp[0].endpoint",
                "not a valid URL",
            ),
            (
                "endpoint = \"http://c\"\nprotocol = \"thrift\"",
                "otlp[0].protocol",
                "\"grpc\", \"http\"",
            ),
            (
                "endpoint = \"http://c\"\nheaders_file = \"/nonexistent/otlp-headers\"",
                "otlp[0].headers_file",
                "cannot be read (/nonexistent/otlp-headers)",
            ),
            (
                "endpoint = \"http://c\"\ntimeout = \"soon\"",
                "otlp[0].timeout",
                "not a duration",
            ),
            (
                "endpoint = \"http://c\"\n[resource_attributes]\n\" \" = \"x\"",
                "otlp[0].resource_attributes",
                "empty attribute name",
            ),
            (
                "endpoint = \"http://c\"\nheaders = 1",
                "otlp[0]",
                "unknown field",
            ),
            ("protocol = \"grpc\"", "otlp[0]", "endpoint"),
        ] {
            let e = read(text).unwrap_err();
            assert_eq!(e.key, key, "{text}: {e}");
            assert!(e.problem.contains(needle), "{text}: {e}");
        }
    }

    #[test]
    fn headers_come_from_a_private_file_and_are_never_printed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("headers");
        fs::write(
            &path,
            "# the collector's key\nAuthorization: Bearer s3cret\n\nx-scope-orgid : tenant-1\n",
        )
        .unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        let text = format!(
            "endpoint = \"http://c\"\nheaders_file = \"{}\"",
            path.display()
        );
        let c = read(&text).unwrap();
        let names: Vec<&str> = c.headers.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["authorization", "x-scope-orgid"]);
        assert_eq!(c.headers[0].1.0, "Bearer s3cret");
        assert_eq!(c.headers[1].1.0, "tenant-1");
        assert!(!format!("{c:?}").contains("s3cret"), "{c:?}");

        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        let e = read(&text).unwrap_err();
        assert_eq!(e.key, "otlp[0].headers_file");
        assert!(e.problem.contains("mode 0644"), "{e}");

        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        fs::write(&path, "no colon here\n").unwrap();
        let e = read(&text).unwrap_err();
        assert!(e.problem.contains("line 1"), "{e}");
    }

    #[test]
    fn header_lines_are_checked() {
        assert!(parse_headers("bad name: x").is_err());
        assert!(parse_headers("x-key:").is_err());
        assert!(parse_headers("x-key: a\u{7}b").is_err());
        assert_eq!(parse_headers("").unwrap(), Vec::new());
    }
}
