//! The geometry of an annotation: `biopb.image.ROI` as proto3 JSON text, checked and put
//! in one canonical form.
//!
//! Only the 2-D vector arms are stored (point, rectangle, ellipse, polygon, polyline,
//! text); `mask` and `mesh` are refused by name (a segmentation is a label tensor, not an
//! annotation). Coordinates are level-0 pixels and must be finite. The parser is strict
//! the way the client's own proto3 JSON parser is, so whatever is stored can be read back
//! by every client: an unknown field is refused rather than dropped.

use serde_json::{Map, Value};
use tessera_proto::image_pb::{self, roi};

/// Longest caption of a text annotation, in characters.
pub const MAX_CAPTION_CHARS: usize = 2000;

/// Why a geometry was refused. The text names the arm and the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("geometry: {0}")]
pub struct GeometryError(String);

fn refuse<T>(text: impl Into<String>) -> Result<T, GeometryError> {
    Err(GeometryError(text.into()))
}

/// A position in level-0 pixels.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Point {
    /// Column.
    pub x: f32,
    /// Row.
    pub y: f32,
    /// Depth, when the client set one.
    pub z: Option<f32>,
}

/// A checked geometry: one of the stored arms.
#[derive(Debug, Clone, PartialEq)]
pub enum Shape {
    /// One point.
    Point(Point),
    /// An axis-aligned box between two corners.
    Rectangle {
        /// One corner.
        top_left: Point,
        /// The opposite corner.
        bottom_right: Point,
    },
    /// An ellipse.
    Ellipse {
        /// Its centre.
        center: Point,
        /// Its radii along its own axes.
        radius: Point,
        /// Its rotation in radians.
        rotation: f32,
    },
    /// A closed outline of at least 3 points.
    Polygon(Vec<Point>),
    /// A stroke of at least 2 points and a width (the brush, in pixels).
    Polyline {
        /// Its vertices.
        points: Vec<Point>,
        /// Its width.
        width: f32,
    },
    /// A non-empty caption anchored at a point.
    Text {
        /// The anchor.
        at: Point,
        /// The caption, line breaks as `\n`.
        text: String,
    },
}

impl Shape {
    /// The arm's name, as `biopb.image.ROI` names it (the `shape` column of `rois`).
    pub fn kind(&self) -> &'static str {
        match self {
            Shape::Point(_) => "point",
            Shape::Rectangle { .. } => "rectangle",
            Shape::Ellipse { .. } => "ellipse",
            Shape::Polygon(_) => "polygon",
            Shape::Polyline { .. } => "polyline",
            Shape::Text { .. } => "text",
        }
    }

    /// Parses and checks the proto3 JSON text of a `biopb.image.ROI`.
    pub fn parse(json: &str) -> Result<Shape, GeometryError> {
        // An empty column is how a row without geometry arrives.
        let json = if json.trim().is_empty() { "{}" } else { json };
        let value: Value = match serde_json::from_str(json) {
            Ok(value) => value,
            Err(e) => return refuse(format!("not JSON: {e}")),
        };
        let Value::Object(fields) = value else {
            return refuse("a biopb.image.ROI is a JSON object");
        };
        let mut arms = fields.iter().filter(|(_, v)| !v.is_null());
        let Some((name, body)) = arms.next() else {
            return refuse(
                "the annotation has no geometry: set one of point, rectangle, ellipse, \
                 polygon, polyline or text",
            );
        };
        if let Some((other, _)) = arms.next() {
            return refuse(format!(
                "sets both '{name}' and '{other}': a biopb.image.ROI holds one shape"
            ));
        }
        match name.as_str() {
            "point" => Ok(Shape::Point(point(body, "point")?)),
            "rectangle" => {
                let f = object(body, "rectangle", &["topLeft", "bottomRight"])?;
                Ok(Shape::Rectangle {
                    top_left: opt_point(&f, "topLeft", "rectangle")?,
                    bottom_right: opt_point(&f, "bottomRight", "rectangle")?,
                })
            }
            "ellipse" => {
                let f = object(body, "ellipse", &["center", "radius", "rotation"])?;
                Ok(Shape::Ellipse {
                    center: opt_point(&f, "center", "ellipse")?,
                    radius: opt_point(&f, "radius", "ellipse")?,
                    rotation: opt_float(&f, "rotation", "ellipse")?,
                })
            }
            "polygon" => {
                let f = object(body, "polygon", &["points"])?;
                let points = points(&f, "polygon")?;
                if points.len() < 3 {
                    return refuse(format!(
                        "a polygon needs at least 3 points, this one has {}",
                        points.len()
                    ));
                }
                Ok(Shape::Polygon(points))
            }
            "polyline" => {
                let f = object(body, "polyline", &["points", "width"])?;
                let points = points(&f, "polyline")?;
                if points.len() < 2 {
                    return refuse(format!(
                        "a polyline needs at least 2 points, this one has {}",
                        points.len()
                    ));
                }
                let width = opt_float(&f, "width", "polyline")?;
                if width < 0.0 {
                    return refuse(format!(
                        "polyline width is {width}: it must not be negative"
                    ));
                }
                Ok(Shape::Polyline { points, width })
            }
            "text" => {
                let f = object(body, "text", &["at", "text"])?;
                let at = opt_point(&f, "at", "text")?;
                let text = match f.get("text") {
                    None | Some(Value::Null) => String::new(),
                    Some(Value::String(s)) => s.replace("\r\n", "\n").replace('\r', "\n"),
                    Some(_) => return refuse("text.text is a string"),
                };
                if text.trim().is_empty() {
                    return refuse("a text annotation needs a non-empty caption (text.text)");
                }
                let chars = text.chars().count();
                if chars > MAX_CAPTION_CHARS {
                    return refuse(format!(
                        "caption is {chars} characters, more than the {MAX_CAPTION_CHARS} a \
                         text annotation may have"
                    ));
                }
                Ok(Shape::Text { at, text })
            }
            "mask" | "mesh" => refuse(format!(
                "'{name}' is not stored: annotations are the 2-D vector shapes (point, \
                 rectangle, ellipse, polygon, polyline, text); a segmentation belongs in a \
                 label tensor"
            )),
            other => refuse(format!("unknown field '{other}' in biopb.image.ROI")),
        }
    }

    /// The canonical proto3 JSON text: lowerCamelCase names, zero scalars left out,
    /// compact. What is stored, listed and shown in SQL.
    pub fn to_json(&self) -> String {
        let (arm, body) = match self {
            Shape::Point(p) => ("point", point_json(p)),
            Shape::Rectangle {
                top_left,
                bottom_right,
            } => (
                "rectangle",
                obj([
                    ("topLeft", Some(point_json(top_left))),
                    ("bottomRight", Some(point_json(bottom_right))),
                ]),
            ),
            Shape::Ellipse {
                center,
                radius,
                rotation,
            } => (
                "ellipse",
                obj([
                    ("center", Some(point_json(center))),
                    ("radius", Some(point_json(radius))),
                    ("rotation", nonzero(*rotation)),
                ]),
            ),
            Shape::Polygon(points) => ("polygon", obj([("points", points_json(points))])),
            Shape::Polyline { points, width } => (
                "polyline",
                obj([("points", points_json(points)), ("width", nonzero(*width))]),
            ),
            Shape::Text { at, text } => (
                "text",
                obj([
                    ("at", Some(point_json(at))),
                    ("text", Some(Value::String(text.clone()))),
                ]),
            ),
        };
        obj([(arm, Some(body))]).to_string()
    }

    /// The geometry as the protobuf message a `RoiPutResult` carries.
    pub fn to_proto(&self) -> image_pb::Roi {
        let shape = match self {
            Shape::Point(p) => roi::Shape::Point(point_pb(p)),
            Shape::Rectangle {
                top_left,
                bottom_right,
            } => roi::Shape::Rectangle(image_pb::Rectangle {
                top_left: Some(point_pb(top_left)),
                bottom_right: Some(point_pb(bottom_right)),
            }),
            Shape::Ellipse {
                center,
                radius,
                rotation,
            } => roi::Shape::Ellipse(image_pb::Ellipse {
                center: Some(point_pb(center)),
                radius: Some(point_pb(radius)),
                rotation: *rotation,
            }),
            Shape::Polygon(points) => roi::Shape::Polygon(image_pb::Polygon {
                points: points.iter().map(point_pb).collect(),
            }),
            Shape::Polyline { points, width } => roi::Shape::Polyline(image_pb::Polyline {
                points: points.iter().map(point_pb).collect(),
                width: *width,
            }),
            Shape::Text { at, text } => roi::Shape::Text(image_pb::Caption {
                at: Some(point_pb(at)),
                text: text.clone(),
            }),
        };
        image_pb::Roi { shape: Some(shape) }
    }
}

/// The fields of a message, with snake_case names (which proto3 JSON also accepts) turned
/// into the lowerCamelCase ones; an unknown field is refused.
fn object(value: &Value, what: &str, known: &[&str]) -> Result<Map<String, Value>, GeometryError> {
    let Value::Object(fields) = value else {
        return refuse(format!("{what} is a JSON object"));
    };
    let mut out = Map::new();
    for (name, v) in fields {
        let camel = camel_case(name);
        if !known.contains(&camel.as_str()) {
            return refuse(format!("unknown field '{name}' in {what}"));
        }
        if out.insert(camel, v.clone()).is_some() {
            return refuse(format!("{what} sets '{name}' twice"));
        }
    }
    Ok(out)
}

fn camel_case(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut upper = false;
    for c in name.chars() {
        if c == '_' {
            upper = true;
        } else if upper {
            out.extend(c.to_uppercase());
            upper = false;
        } else {
            out.push(c);
        }
    }
    out
}

fn point(value: &Value, what: &str) -> Result<Point, GeometryError> {
    let f = object(value, what, &["x", "y", "z"])?;
    Ok(Point {
        x: opt_float(&f, "x", what)?,
        y: opt_float(&f, "y", what)?,
        z: match f.get("z") {
            None | Some(Value::Null) => None,
            Some(v) => Some(float(v, &format!("{what}.z"))?),
        },
    })
}

fn opt_point(f: &Map<String, Value>, name: &str, what: &str) -> Result<Point, GeometryError> {
    match f.get(name) {
        None | Some(Value::Null) => Ok(Point::default()),
        Some(v) => point(v, &format!("{what}.{name}")),
    }
}

fn points(f: &Map<String, Value>, what: &str) -> Result<Vec<Point>, GeometryError> {
    match f.get("points") {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => items
            .iter()
            .enumerate()
            .map(|(i, v)| point(v, &format!("{what}.points[{i}]")))
            .collect(),
        Some(_) => refuse(format!("{what}.points is a JSON array")),
    }
}

fn opt_float(f: &Map<String, Value>, name: &str, what: &str) -> Result<f32, GeometryError> {
    match f.get(name) {
        None | Some(Value::Null) => Ok(0.0),
        Some(v) => float(v, &format!("{what}.{name}")),
    }
}

/// A finite float32, written as proto3 JSON writes one: a number, or a string holding one
/// (`"NaN"` and `"Infinity"` are how it writes the values refused here).
fn float(value: &Value, what: &str) -> Result<f32, GeometryError> {
    let wide = match value {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.trim().parse::<f64>().ok(),
        _ => None,
    };
    let Some(wide) = wide else {
        return refuse(format!("{what} is not a number"));
    };
    let narrow = wide as f32;
    if !narrow.is_finite() {
        return refuse(format!(
            "{what} is {}: coordinates are level-0 pixels and must be finite float32 values",
            match value {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            }
        ));
    }
    Ok(narrow)
}

fn obj<const N: usize>(fields: [(&str, Option<Value>); N]) -> Value {
    Value::Object(
        fields
            .into_iter()
            .filter_map(|(k, v)| v.map(|v| (k.to_string(), v)))
            .collect(),
    )
}

fn nonzero(v: f32) -> Option<Value> {
    (v != 0.0).then(|| Value::from(v))
}

fn point_json(p: &Point) -> Value {
    obj([
        ("x", nonzero(p.x)),
        ("y", nonzero(p.y)),
        ("z", p.z.map(Value::from)),
    ])
}

fn points_json(points: &[Point]) -> Option<Value> {
    (!points.is_empty()).then(|| Value::Array(points.iter().map(point_json).collect()))
}

fn point_pb(p: &Point) -> image_pb::Point {
    image_pb::Point {
        x: p.x,
        y: p.y,
        z: p.z,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(json: &str) -> String {
        match Shape::parse(json) {
            Ok(shape) => panic!("{json} was accepted as {shape:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn every_stored_arm_round_trips_through_its_canonical_json() {
        let cases = [
            r#"{"point": {"x": 1.5, "y": 2.0}}"#,
            r#"{"point": {}}"#,
            r#"{"rectangle": {"top_left": {"x": 1}, "bottomRight": {"x": 5, "y": 6}}}"#,
            r#"{"ellipse": {"center": {"x": 3, "y": 4, "z": 0}, "radius": {"x": 2, "y": 1}, "rotation": 0.5}}"#,
            r#"{"polygon": {"points": [{"x": 0}, {"x": 4}, {"y": 4}]}}"#,
            r#"{"polyline": {"points": [{"x": "1.5"}, {"x": 4, "y": 1}], "width": 3}}"#,
            r#"{"text": {"at": {"x": 9}, "text": "a\r\nb"}}"#,
        ];
        for json in cases {
            let shape = Shape::parse(json).unwrap_or_else(|e| panic!("{json}: {e}"));
            let again = Shape::parse(&shape.to_json()).unwrap_or_else(|e| panic!("{json}: {e}"));
            assert_eq!(shape, again, "{json}");
        }
        let text = Shape::parse(r#"{"text": {"text": "a\r\nb"}}"#).ok();
        assert!(matches!(text, Some(Shape::Text { text, .. }) if text == "a\nb"));
        let z = Shape::parse(r#"{"point": {"z": 0}}"#).map(|s| s.to_json());
        assert_eq!(z.ok().as_deref(), Some(r#"{"point":{"z":0.0}}"#));
    }

    #[test]
    fn refusals_name_the_arm_and_the_field() {
        assert!(refused(r#"{"mask": {}}"#).contains("'mask' is not stored"));
        assert!(refused(r#"{"mesh": {"verts": []}}"#).contains("'mesh' is not stored"));
        assert!(refused("{}").contains("no geometry"));
        assert!(refused("").contains("no geometry"));
        assert!(refused(r#"{"point": {}, "text": {}}"#).contains("holds one shape"));
        assert!(refused(r#"{"point": {"x": "NaN"}}"#).contains("point.x is NaN"));
        assert!(refused(r#"{"point": {"y": "-Infinity"}}"#).contains("finite"));
        assert!(refused(r#"{"point": {"x": 1e300}}"#).contains("finite"));
        assert!(refused(r#"{"polygon": {"points": [{"x": 1}, {"x": 2}]}}"#).contains("at least 3"));
        assert!(refused(r#"{"polyline": {"points": [{"x": 1}]}}"#).contains("at least 2"));
        assert!(refused(r#"{"polyline": {"points": [{}, {}], "width": -1}}"#).contains("negative"));
        assert!(refused(r#"{"text": {"text": " \n"}}"#).contains("non-empty caption"));
        let long = format!(r#"{{"text": {{"text": "{}"}}}}"#, "a".repeat(2001));
        assert!(refused(&long).contains("2000"));
        assert!(refused(r#"{"point": {"w": 1}}"#).contains("unknown field 'w' in point"));
        assert!(refused(r#"{"circle": {}}"#).contains("unknown field 'circle'"));
        assert!(refused("[1]").contains("JSON object"));
        assert!(refused("{").contains("not JSON"));
        assert!(
            refused(r#"{"polygon": {"points": [{}, {}, {"x": true}]}}"#)
                .contains("polygon.points[2].x")
        );
    }
}
