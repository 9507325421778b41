//! The rows a statement returned (`RETURNING version`), as JSON objects for a local write's
//! answer. Columns of the types a parameter can be given in (`super::statements`) come back as
//! their JSON values; any other type comes back as `null` (cast it in the SQL, e.g.
//! `RETURNING id::text`). It never fails a write: the row count is what the guard judges.

use serde_json::{Map, Value};
use tokio_postgres::Row;
use tokio_postgres::types::Type;

/// One returned row, `{"column": value, ...}`.
pub(crate) fn row_json(row: &Row) -> Value {
    let mut object = Map::new();
    for (n, column) in row.columns().iter().enumerate() {
        object.insert(column.name().to_string(), cell(row, n, column.type_()));
    }
    Value::Object(object)
}

fn cell(row: &Row, n: usize, ty: &Type) -> Value {
    let value = match *ty {
        Type::BOOL => row
            .try_get::<_, Option<bool>>(n)
            .map(|v| v.map(Value::from)),
        Type::INT2 => row.try_get::<_, Option<i16>>(n).map(|v| v.map(Value::from)),
        Type::INT4 => row.try_get::<_, Option<i32>>(n).map(|v| v.map(Value::from)),
        Type::INT8 => row.try_get::<_, Option<i64>>(n).map(|v| v.map(Value::from)),
        Type::FLOAT4 => row.try_get::<_, Option<f32>>(n).map(|v| v.map(Value::from)),
        Type::FLOAT8 => row.try_get::<_, Option<f64>>(n).map(|v| v.map(Value::from)),
        Type::TEXT | Type::VARCHAR | Type::BPCHAR | Type::NAME => row
            .try_get::<_, Option<String>>(n)
            .map(|v| v.map(Value::from)),
        _ => return Value::Null,
    };
    value.ok().flatten().unwrap_or(Value::Null)
}
