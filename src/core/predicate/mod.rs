//! Boolean SQL predicates (`apply_as_deletes`, `apply_as_truncates`) over source columns.
//!
//! The SQL text is parsed with `sqlparser`, validated against the source schema and compiled into a
//! small expression tree (column names resolved, literals already cast to the comparison type).
//! Evaluation walks that tree with Arrow compute kernels using SQL three-valued logic; the final
//! result maps NULL to false.

use arrow_arith::boolean::{and_kleene, is_not_null, is_null, not, or_kleene};
use arrow_array::cast::AsArray;
use arrow_array::{
    Array, ArrayRef, BooleanArray, Datum, RecordBatch, Scalar, StringArray, make_array,
    new_null_array,
};
use arrow_cast::{CastOptions, cast, cast_with_options};
use arrow_ord::cmp;
use arrow_schema::{ArrowError, DataType, Schema};
use arrow_string::like::{like, nlike};
use sqlparser::ast::{BinaryOperator, Expr, Ident, InTarget, UnaryOperator, Value};
use sqlparser::dialect::GenericDialect;
use sqlparser::parser::Parser;
use sqlparser::tokenizer::Token;
use std::sync::Arc;

const SUPPORTED: &str = "only columns, literals, comparisons (= <> != < <= > >=), AND, OR, \
    NOT, IS [NOT] NULL, IS [NOT] TRUE/FALSE, [NOT] IN (literals), [NOT] BETWEEN and [NOT] LIKE are \
    allowed; rewrite it with those, e.g. `op = 'DELETE'`";

const SUPPORTED_VALUES: &str = "a sequence_by expression may use columns, literals, \
    + - * / %, unary minus, coalesce (ifnull, nvl), CAST / TRY_CAST to a column type and, as the \
    whole expression, struct(...); e.g. `coalesce(lsn, 0)` or `ts * 1000 + n`";

/// Errors from parsing, validating or evaluating a predicate. `Display` omits the code (callers
/// add it from [`PredicateError::code`]).
#[derive(Debug, thiserror::Error)]
pub enum PredicateError {
    /// `AUTOCDC_INVALID_EXPRESSION.PARSE`: not valid SQL expression syntax.
    #[error(
        "cannot parse expression `{sql}`: {message}; write a boolean SQL condition over source \
         columns, e.g. `op = 'DELETE'`"
    )]
    Parse { sql: String, message: String },
    /// `AUTOCDC_MULTIPART_COLUMN_IDENTIFIER`: a qualified name such as `changes.op`.
    #[error(
        "expression `{sql}` references `{identifier}`, a multi-part identifier; use a plain \
         column name such as `{}`",
        .identifier.rsplit('.').next().unwrap_or("op")
    )]
    Multipart { sql: String, identifier: String },
    /// `AUTOCDC_COLUMNS_NOT_FOUND_IN_SCHEMA`: a column missing from the source schema.
    #[error(
        "expression `{sql}` references column `{column}`, which is not in the source schema; \
         check the spelling or use an existing source column (string literals take single \
         quotes: 'DELETE', not \"DELETE\")"
    )]
    UnknownColumn { sql: String, column: String },
    /// `AUTOCDC_INVALID_EXPRESSION.UNSUPPORTED`: function calls, subqueries, arithmetic, ...
    #[error("expression `{sql}` uses {construct}, which is not supported: {SUPPORTED}")]
    Unsupported { sql: String, construct: String },
    /// `AUTOCDC_INVALID_EXPRESSION.UNSUPPORTED`, in a `sequence_by` expression.
    #[error("expression `{sql}` uses {construct}, which is not supported: {SUPPORTED_VALUES}")]
    UnsupportedValue { sql: String, construct: String },
    /// `AUTOCDC_INVALID_EXPRESSION.TYPE`: incomparable operands or a non-boolean expression.
    #[error("expression `{sql}` is not well-typed: {message}")]
    Type { sql: String, message: String },
    /// `AUTOCDC_INVALID_EXPRESSION.EVAL`: an Arrow error during evaluation.
    #[error(
        "failed to evaluate expression `{sql}`: {message}; check that the batch's columns have \
         the types of the source schema"
    )]
    Eval { sql: String, message: String },
    /// `AUTOCDC_INVALID_EXPRESSION.TOO_LARGE`: longer or more deeply built than the limits.
    #[error(
        "the expression is {bytes} bytes with {operators} operators; at most {MAX_SQL_BYTES} \
         bytes and {max_operators} operators are accepted (use IN (...) for long lists)"
    )]
    TooLarge {
        bytes: usize,
        operators: usize,
        max_operators: usize,
    },
}

/// The longest expression text accepted, checked before tokenizing.
pub const MAX_SQL_BYTES: usize = 64 * 1024;
/// The most operators (AND, OR, NOT, comparisons, ...) in one expression.
/// Chains of AND / OR are compiled and torn down without recursion, and
/// the parser bounds nesting (parentheses, NOT) itself, so this bounds the
/// work, not the stack.
pub const MAX_SQL_OPERATORS: usize = 10_000;

/// The codes of expression errors (registered in `crate::error::REGISTRY`;
/// defined here so this module stays free of the crate).
pub mod codes {
    use crate::error::codes as all;
    pub const PARSE: &str = all::EXPRESSION_PARSE;
    pub const MULTIPART: &str = all::MULTIPART_IDENTIFIER;
    pub const UNKNOWN_COLUMN: &str = all::COLUMNS_NOT_FOUND;
    pub const UNSUPPORTED: &str = all::EXPRESSION_UNSUPPORTED;
    pub const TYPE: &str = all::EXPRESSION_TYPE;
    pub const EVAL: &str = all::EXPRESSION_EVAL;
    pub const TOO_LARGE: &str = all::EXPRESSION_TOO_LARGE;
}

impl PredicateError {
    /// Stable error code.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Parse { .. } => codes::PARSE,
            Self::Multipart { .. } => codes::MULTIPART,
            Self::UnknownColumn { .. } => codes::UNKNOWN_COLUMN,
            Self::Unsupported { .. } | Self::UnsupportedValue { .. } => codes::UNSUPPORTED,
            Self::Type { .. } => codes::TYPE,
            Self::Eval { .. } => codes::EVAL,
            Self::TooLarge { .. } => codes::TOO_LARGE,
        }
    }
}

impl crate::error::Coded for PredicateError {
    fn code(&self) -> &'static str {
        PredicateError::code(self)
    }
}

/// A parsed, validated boolean expression over source columns.
#[derive(Debug, Clone)]
pub struct Predicate {
    sql: String,
    columns: Vec<String>,
    root: Node,
}

/// Comparison operand: a column (index into `columns`, cast to the comparison type when its own
/// type differs) or a one-element literal array already in the comparison type.
#[derive(Debug, Clone)]
enum Operand {
    Column(usize, DataType),
    Literal(ArrayRef),
}

/// An Arrow comparison kernel (`eq`, `lt`, `like`, ...).
type Kernel = fn(&dyn Datum, &dyn Datum) -> Result<BooleanArray, ArrowError>;

#[derive(Debug, Clone)]
enum Node {
    Const(Option<bool>),
    /// A Boolean column used as a condition.
    Column(usize),
    Cmp(Kernel, Operand, Operand),
    And(Vec<Node>),
    Or(Vec<Node>),
    Not(Box<Node>),
    /// Column `IS NULL` (false) / `IS NOT NULL` (true).
    IsNull(usize, bool),
    /// `IS TRUE` (true, false), `IS FALSE` (false, false); the second flag adds `NOT`.
    IsBool(Box<Node>, bool, bool),
}

/// A comparison operand before type coercion.
enum Val {
    Column(usize, DataType),
    Lit(Lit),
}

pub(super) enum Lit {
    Str(String),
    Num(String),
    Bool(bool),
    Null,
}

struct Compiler<'a> {
    sql: &'a str,
    schema: &'a Schema,
    columns: Vec<String>,
}

impl Predicate {
    /// Parses `sql` and checks every referenced column exists in `schema` and that the expression
    /// is boolean-typed.
    pub fn parse(sql: &str, schema: &Schema) -> Result<Predicate, PredicateError> {
        let expr = parse_expr(sql, MAX_SQL_OPERATORS)?;
        let mut c = Compiler {
            sql,
            schema,
            columns: Vec::new(),
        };
        let root = c.boolean(&expr);
        drop_expr(expr);
        let root = root?;
        Ok(Predicate {
            sql: sql.to_string(),
            columns: c.columns,
            root,
        })
    }

    /// Source text as given.
    pub fn sql(&self) -> &str {
        &self.sql
    }

    /// Plain column names the expression references (deduplicated, in first-seen order).
    pub fn columns(&self) -> &[String] {
        &self.columns
    }

    /// Evaluates over a batch whose schema contains the referenced columns (looked up by name).
    /// SQL three-valued logic inside; the returned array has no nulls: a NULL result means false.
    pub fn evaluate(&self, batch: &RecordBatch) -> Result<BooleanArray, PredicateError> {
        let eval_err = |message: String| PredicateError::Eval {
            sql: self.sql.clone(),
            message,
        };
        let mut arrays = Vec::with_capacity(self.columns.len());
        for name in &self.columns {
            let col = batch.column_by_name(name);
            arrays.push(col.ok_or_else(|| eval_err(format!("the batch has no column `{name}`")))?);
        }
        let (arrays, rows) = (&arrays[..], batch.num_rows());
        let out = Eval { arrays, rows }
            .node(&self.root)
            .map_err(|e| eval_err(e.to_string()))?;
        Ok(null_as_false(out))
    }
}

/// Parses `sql` as one SQL expression, after checking its size and its
/// number of operators (shared with `seq_expr`).
pub(super) fn parse_expr(sql: &str, max_operators: usize) -> Result<Expr, PredicateError> {
    let dialect = GenericDialect {};
    let parse_err = |message: String| PredicateError::Parse {
        sql: sql.to_string(),
        message,
    };
    if sql.len() > MAX_SQL_BYTES {
        return Err(PredicateError::TooLarge {
            bytes: sql.len(),
            operators: 0,
            max_operators,
        });
    }
    let tokens = sqlparser::tokenizer::Tokenizer::new(&dialect, sql)
        .tokenize()
        .map_err(|e| parse_err(e.to_string()))?;
    let operators = tokens.iter().filter(|t| is_operator(t)).count();
    if operators > max_operators {
        return Err(PredicateError::TooLarge {
            bytes: sql.len(),
            operators,
            max_operators,
        });
    }
    let mut parser = Parser::new(&dialect)
        .try_with_sql(sql)
        .map_err(|e| parse_err(e.to_string()))?;
    let expr = parser.parse_expr().map_err(|e| parse_err(e.to_string()))?;
    let rest = parser.peek_token().token;
    if rest != Token::EOF {
        drop_expr(expr);
        return Err(parse_err(format!(
            "unexpected `{rest}` after the expression"
        )));
    }
    Ok(expr)
}

/// The field of `schema` a plain name resolves to: an exact match, else the
/// one case-insensitive match of an unquoted name (shared with `seq_expr`).
pub(super) fn resolve(sql: &str, schema: &Schema, ident: &Ident) -> Result<usize, PredicateError> {
    let fields = schema.fields();
    fields
        .iter()
        .position(|f| f.name() == &ident.value)
        .or_else(|| {
            let mut it = fields
                .iter()
                .enumerate()
                .filter(|(_, f)| f.name().eq_ignore_ascii_case(&ident.value));
            it.next()
                .filter(|_| ident.quote_style.is_none() && it.next().is_none())
                .map(|(i, _)| i)
        })
        .ok_or_else(|| PredicateError::UnknownColumn {
            sql: sql.to_string(),
            column: ident.value.clone(),
        })
}

/// The error for a multi-part name such as `changes.op`.
pub(super) fn multipart(sql: &str, parts: &[Ident]) -> PredicateError {
    PredicateError::Multipart {
        sql: sql.to_string(),
        identifier: parts
            .iter()
            .map(|p| p.value.as_str())
            .collect::<Vec<_>>()
            .join("."),
    }
}

/// A literal's value; None for a kind expressions do not take.
pub(super) fn literal(v: &Value) -> Option<Lit> {
    Some(match v {
        Value::Number(n, _) => Lit::Num(n.to_string()),
        Value::Boolean(b) => Lit::Bool(*b),
        Value::Null => Lit::Null,
        Value::SingleQuotedString(s)
        | Value::EscapedStringLiteral(s)
        | Value::NationalStringLiteral(s)
        | Value::UnicodeStringLiteral(s) => Lit::Str(s.clone()),
        _ => return None,
    })
}

/// Drops a parsed expression without recursing down its AND / OR chains
/// (a chain of thousands of terms is a tree that deep; the default drop
/// would recurse once per term).
pub(super) fn drop_expr(e: Expr) {
    let mut stack = vec![e];
    while let Some(e) = stack.pop() {
        if let Expr::BinaryOp { left, right, .. } = e {
            stack.push(*left);
            stack.push(*right);
        }
    }
}

/// A token that counts as an operator.
fn is_operator(t: &Token) -> bool {
    use sqlparser::keywords::Keyword;
    match t {
        Token::Word(w) => matches!(
            w.keyword,
            Keyword::AND
                | Keyword::OR
                | Keyword::NOT
                | Keyword::IS
                | Keyword::LIKE
                | Keyword::BETWEEN
                | Keyword::IN
        ),
        Token::LParen
        | Token::Eq
        | Token::DoubleEq
        | Token::Neq
        | Token::Lt
        | Token::Gt
        | Token::LtEq
        | Token::GtEq
        | Token::Spaceship
        | Token::Plus
        | Token::Minus
        | Token::Mul
        | Token::Div
        | Token::Mod
        | Token::StringConcat => true,
        _ => false,
    }
}

impl Compiler<'_> {
    fn unsupported(&self, construct: String) -> PredicateError {
        PredicateError::Unsupported {
            sql: self.sql.to_string(),
            construct,
        }
    }

    fn type_err(&self, message: String) -> PredicateError {
        PredicateError::Type {
            sql: self.sql.to_string(),
            message,
        }
    }

    /// Resolves a plain column name: exact match, else a unique case-insensitive match for an
    /// unquoted name. Returns the index into `self.columns` and the column's type.
    fn column(&mut self, ident: &Ident) -> Result<Val, PredicateError> {
        let field = self.schema.field(resolve(self.sql, self.schema, ident)?);
        let idx = self
            .columns
            .iter()
            .position(|c| c == field.name())
            .unwrap_or_else(|| {
                self.columns.push(field.name().clone());
                self.columns.len() - 1
            });
        Ok(Val::Column(idx, field.data_type().clone()))
    }

    /// Compiles an expression that must produce a boolean.
    fn boolean(&mut self, e: &Expr) -> Result<Node, PredicateError> {
        use BinaryOperator as B;
        Ok(match e {
            Expr::Nested(inner) => self.boolean(inner)?,
            Expr::BinaryOp {
                op: op @ (B::And | B::Or),
                ..
            } => {
                // Flatten same-operator chains iteratively so long `a OR b OR ...` stay shallow.
                let (mut parts, mut stack) = (Vec::new(), vec![e]);
                while let Some(cur) = stack.pop() {
                    match cur {
                        Expr::BinaryOp { left, op: o, right } if o == op => {
                            stack.extend([right.as_ref(), left.as_ref()]);
                        }
                        other => parts.push(self.boolean(other)?),
                    }
                }
                if *op == B::And {
                    Node::And(parts)
                } else {
                    Node::Or(parts)
                }
            }
            Expr::BinaryOp { left, op, right } => {
                let kernel: Kernel = match op {
                    B::Eq => cmp::eq,
                    B::NotEq => cmp::neq,
                    B::Lt => cmp::lt,
                    B::LtEq => cmp::lt_eq,
                    B::Gt => cmp::gt,
                    B::GtEq => cmp::gt_eq,
                    other => return Err(self.unsupported(format!("the operator `{other}`"))),
                };
                self.compare(kernel, false, left, right)?
            }
            Expr::UnaryOp {
                op: UnaryOperator::Not,
                expr,
            } => Node::Not(Box::new(self.boolean(expr)?)),
            Expr::IsNull(x) | Expr::IsNotNull(x) => {
                let negated = matches!(e, Expr::IsNotNull(_));
                match self.value(x)? {
                    Val::Column(idx, _) => Node::IsNull(idx, negated),
                    Val::Lit(l) => Node::Const(Some(matches!(l, Lit::Null) != negated)),
                }
            }
            Expr::IsTrue(x) | Expr::IsNotTrue(x) | Expr::IsFalse(x) | Expr::IsNotFalse(x) => {
                let value = matches!(e, Expr::IsTrue(_) | Expr::IsNotTrue(_));
                let negated = matches!(e, Expr::IsNotTrue(_) | Expr::IsNotFalse(_));
                Node::IsBool(Box::new(self.boolean(x)?), value, negated)
            }
            Expr::In {
                expr,
                target: InTarget::List(list),
                negated,
                ..
            } => {
                let parts = list
                    .iter()
                    .map(|item| self.compare(cmp::eq, false, expr, item));
                negate(Node::Or(parts.collect::<Result<_, _>>()?), *negated)
            }
            Expr::Between {
                expr,
                negated,
                low,
                high,
            } => {
                let low = self.compare(cmp::gt_eq, false, expr, low)?;
                negate(
                    Node::And(vec![low, self.compare(cmp::lt_eq, false, expr, high)?]),
                    *negated,
                )
            }
            Expr::Like {
                negated,
                any: false,
                expr,
                pattern,
                escape_char: None,
            } => {
                let kernel: Kernel = if *negated { nlike } else { like };
                self.compare(kernel, true, expr, pattern)?
            }
            Expr::Identifier(_) | Expr::CompoundIdentifier(_) | Expr::Value(_) => {
                match self.value(e)? {
                    Val::Column(idx, DataType::Boolean) => Node::Column(idx),
                    Val::Lit(Lit::Bool(b)) => Node::Const(Some(b)),
                    Val::Lit(Lit::Null) => Node::Const(None),
                    Val::Column(idx, ty) => {
                        let name = &self.columns[idx];
                        return Err(self.type_err(format!(
                            "column `{name}` has type {ty}, not Boolean, so it is not a condition; \
                             compare it instead, e.g. `{name} = 'DELETE'` or `{name} IS NOT NULL`"
                        )));
                    }
                    Val::Lit(_) => {
                        return Err(self.type_err(format!(
                            "the literal `{e}` is not a boolean; write a condition such as \
                             `op = 'DELETE'`"
                        )));
                    }
                }
            }
            other => return Err(self.unsupported(describe(other))),
        })
    }

    /// Compiles a comparison operand (column or literal).
    fn value(&mut self, e: &Expr) -> Result<Val, PredicateError> {
        match e {
            Expr::Nested(inner) => self.value(inner),
            Expr::Identifier(ident) => self.column(ident),
            Expr::CompoundIdentifier(parts) => Err(multipart(self.sql, parts)),
            Expr::Value(v) => literal(&v.value)
                .map(Val::Lit)
                .ok_or_else(|| self.unsupported(format!("the literal `{v}`"))),
            Expr::UnaryOp {
                op: op @ (UnaryOperator::Minus | UnaryOperator::Plus),
                expr,
            } => match (self.value(expr)?, op) {
                (Val::Lit(Lit::Num(n)), UnaryOperator::Minus) => {
                    let n = n
                        .strip_prefix('-')
                        .map_or_else(|| format!("-{n}"), str::to_string);
                    Ok(Val::Lit(Lit::Num(n)))
                }
                (Val::Lit(Lit::Num(n)), _) => Ok(Val::Lit(Lit::Num(n))),
                _ => Err(self.unsupported(format!("the arithmetic expression `{e}`"))),
            },
            other => Err(self.unsupported(format!(
                "{} as an operand (operands must be columns or literals)",
                describe(other)
            ))),
        }
    }

    fn compare(
        &mut self,
        kernel: Kernel,
        is_like: bool,
        l: &Expr,
        r: &Expr,
    ) -> Result<Node, PredicateError> {
        let (lv, rv) = (self.value(l)?, self.value(r)?);
        let ty = match (&lv, &rv) {
            (Val::Column(_, a), Val::Column(_, b)) => common_type(a, b),
            (Val::Column(_, ct), Val::Lit(lit)) | (Val::Lit(lit), Val::Column(_, ct)) => {
                literal_type(ct, lit)
            }
            (Val::Lit(_), Val::Lit(_)) => {
                return Err(self.unsupported(format!(
                    "a comparison of two literals (`{l}` with `{r}`); one side must be a column"
                )));
            }
        };
        let show = |v: &Val, e: &Expr| match v {
            Val::Column(i, t) => format!("column `{}` ({t})", self.columns[*i]),
            Val::Lit(_) => format!("`{e}`"),
        };
        let mismatch = |why: String| {
            self.type_err(format!(
                "cannot compare {} with {}{why}; use a literal or column of the same kind, e.g. \
                 `op = 'DELETE'`, `kind >= 10.5` or `ts > '2024-01-01 00:00:00'` (quote text, dates \
                 and timestamps)",
                show(&lv, l),
                show(&rv, r)
            ))
        };
        let Some(ty) = ty else {
            return Err(mismatch(String::new()));
        };
        let operand = |v: &Val| match v {
            Val::Column(i, _) => Ok(Operand::Column(*i, ty.clone())),
            Val::Lit(lit) => lit_array(lit, &ty).map(Operand::Literal),
        };
        let (lo, ro) = match (operand(&lv), operand(&rv)) {
            (Ok(lo), Ok(ro)) => (lo, ro),
            (Err(e), _) | (_, Err(e)) => return Err(mismatch(format!(" ({e})"))),
        };
        if is_like && !is_string(&ty) {
            return Err(self.type_err(format!(
                "LIKE needs a string column but {} is compared as {ty}; use `=`, `<` or `>` instead",
                show(&lv, l)
            )));
        }
        Ok(Node::Cmp(kernel, lo, ro))
    }
}

/// Maps NULL to false (three-valued result to a filter).
fn null_as_false(a: BooleanArray) -> BooleanArray {
    match a.nulls() {
        Some(n) => BooleanArray::new(a.values() & n.inner(), None),
        None => a,
    }
}

fn negate(n: Node, negated: bool) -> Node {
    if negated { Node::Not(Box::new(n)) } else { n }
}

/// The type a column of type `ct` and `lit` are compared in, if they are comparable.
fn literal_type(ct: &DataType, lit: &Lit) -> Option<DataType> {
    match lit {
        Lit::Null | Lit::Str(_) => Some(ct.clone()),
        Lit::Bool(_) => (*ct == DataType::Boolean).then(|| ct.clone()),
        Lit::Num(n) => {
            let (ck, lk) = (num_kind(ct)?, num_kind_of_literal(n)?);
            // Keep the column's own type when the literal fits it exactly.
            let fits = match (ck, lk) {
                (NumKind::Float, _) => true,
                (NumKind::Fixed(_, cs), NumKind::Fixed(_, ls)) => ls <= cs,
                (NumKind::Fixed(..), NumKind::Float) => false,
            };
            Some(if fits && lit_array(lit, ct).is_ok() {
                ct.clone()
            } else {
                combine(ck, lk)
            })
        }
    }
}

/// A one-element array holding `lit` as type `ty` (strict: no silent NULLs on bad input).
pub(super) fn lit_array(lit: &Lit, ty: &DataType) -> Result<ArrayRef, ArrowError> {
    let text = match lit {
        Lit::Null => return Ok(new_null_array(ty, 1)),
        Lit::Bool(b) => return cast(&BooleanArray::from(vec![*b]), ty),
        Lit::Str(s) | Lit::Num(s) => StringArray::from(vec![s.as_str()]),
    };
    let strict = CastOptions {
        safe: false,
        ..Default::default()
    };
    match ty {
        // Zoned timestamps: read the text as UTC (explicit offsets honoured) and relabel, so the
        // result does not depend on arrow's optional chrono-tz support for named zones.
        DataType::Timestamp(unit, Some(_)) => {
            let naive = cast_with_options(&text, &DataType::Timestamp(*unit, None), &strict)?;
            Ok(make_array(
                naive
                    .to_data()
                    .into_builder()
                    .data_type(ty.clone())
                    .build()?,
            ))
        }
        _ => cast_with_options(&text, ty, &strict),
    }
}

#[derive(Clone, Copy)]
pub(super) enum NumKind {
    /// Exact: (integer digits, scale).
    Fixed(u8, u8),
    Float,
}

pub(super) fn num_kind(t: &DataType) -> Option<NumKind> {
    use DataType::*;
    Some(match t {
        Int8 | UInt8 => NumKind::Fixed(3, 0),
        Int16 | UInt16 => NumKind::Fixed(5, 0),
        Int32 | UInt32 => NumKind::Fixed(10, 0),
        Int64 => NumKind::Fixed(19, 0),
        UInt64 => NumKind::Fixed(20, 0),
        Decimal32(p, s) | Decimal64(p, s) | Decimal128(p, s) if *s >= 0 && *s as u8 <= *p => {
            NumKind::Fixed(p - *s as u8, *s as u8)
        }
        Float16 | Float32 | Float64 | Decimal256(..) => NumKind::Float,
        _ => return None,
    })
}

pub(super) fn num_kind_of_literal(n: &str) -> Option<NumKind> {
    let digits = n.trim_start_matches(['-', '+']);
    if digits.contains(['e', 'E']) {
        return Some(NumKind::Float);
    }
    let (int, frac) = digits.split_once('.').unwrap_or((digits, ""));
    if !(int.chars().chain(frac.chars())).all(|c| c.is_ascii_digit()) {
        return None;
    }
    let int_digits = int.trim_start_matches('0').len().max(1);
    match (u8::try_from(int_digits), u8::try_from(frac.len())) {
        (Ok(i), Ok(s)) if i as usize + s as usize <= 38 => Some(NumKind::Fixed(i, s)),
        _ => Some(NumKind::Float),
    }
}

/// Smallest exact decimal holding both kinds, else Float64.
pub(super) fn combine(a: NumKind, b: NumKind) -> DataType {
    match (a, b) {
        (NumKind::Fixed(ai, a_s), NumKind::Fixed(bi, b_s))
            if u16::from(ai.max(bi)) + u16::from(a_s.max(b_s)) <= 38 =>
        {
            DataType::Decimal128(38, a_s.max(b_s) as i8)
        }
        _ => DataType::Float64,
    }
}

pub(super) fn is_string(t: &DataType) -> bool {
    matches!(t, DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View)
}

fn common_type(a: &DataType, b: &DataType) -> Option<DataType> {
    if a == b {
        Some(a.clone())
    } else if is_string(a) && is_string(b) {
        Some(DataType::LargeUtf8)
    } else {
        Some(combine(num_kind(a)?, num_kind(b)?))
    }
}

pub(super) fn describe(e: &Expr) -> String {
    use BinaryOperator as B;
    let kind = match e {
        Expr::Function(_) => "the function call",
        Expr::Subquery(_) | Expr::Exists { .. } | Expr::In { .. } => "the subquery",
        Expr::BinaryOp {
            op: B::Eq | B::NotEq | B::Lt | B::LtEq | B::Gt | B::GtEq | B::And | B::Or,
            ..
        }
        | Expr::UnaryOp {
            op: UnaryOperator::Not,
            ..
        } => "the condition",
        Expr::BinaryOp { .. } | Expr::UnaryOp { .. } => "the operator expression",
        Expr::Cast { .. } => "the cast",
        Expr::Case { .. } => "the CASE expression",
        Expr::Like { .. } => "the LIKE ANY/ESCAPE form",
        _ => "the expression",
    };
    format!("{kind} `{e}`")
}

struct Eval<'a> {
    arrays: &'a [&'a ArrayRef],
    rows: usize,
}

impl Eval<'_> {
    fn raw(&self, idx: usize) -> Result<&ArrayRef, ArrowError> {
        let missing = || ArrowError::InvalidArgumentError(format!("column #{idx} is missing"));
        self.arrays.get(idx).copied().ok_or_else(missing)
    }

    /// Column `idx` of the batch, cast to `ty` if its type differs.
    fn column(&self, idx: usize, ty: &DataType) -> Result<ArrayRef, ArrowError> {
        let a = self.raw(idx)?;
        if a.data_type() == ty {
            Ok(Arc::clone(a))
        } else {
            cast(a, ty)
        }
    }

    fn operand(&self, o: &Operand) -> Result<Box<dyn Datum>, ArrowError> {
        Ok(match o {
            Operand::Column(idx, ty) => Box::new(self.column(*idx, ty)?),
            Operand::Literal(a) => Box::new(Scalar::new(Arc::clone(a))),
        })
    }

    fn node(&self, n: &Node) -> Result<BooleanArray, ArrowError> {
        Ok(match n {
            Node::Const(Some(v)) => BooleanArray::from(vec![*v; self.rows]),
            Node::Const(None) => BooleanArray::new_null(self.rows),
            Node::Column(idx) => {
                let a = self.column(*idx, &DataType::Boolean)?;
                let err = || ArrowError::CastError("expected a Boolean column".into());
                a.as_boolean_opt().ok_or_else(err)?.clone()
            }
            Node::Cmp(kernel, l, r) => {
                kernel(self.operand(l)?.as_ref(), self.operand(r)?.as_ref())?
            }
            Node::And(parts) | Node::Or(parts) => {
                let is_and = matches!(n, Node::And(_));
                let combine = if is_and { and_kleene } else { or_kleene };
                let mut acc = BooleanArray::from(vec![is_and; self.rows]);
                for p in parts {
                    acc = combine(&acc, &self.node(p)?)?;
                }
                acc
            }
            Node::Not(inner) => not(&self.node(inner)?)?,
            Node::IsNull(idx, negated) => {
                let test = if *negated { is_not_null } else { is_null };
                test(self.raw(*idx)?)?
            }
            Node::IsBool(inner, value, negated) => {
                let v = self.node(inner)?;
                let v = null_as_false(if *value { v } else { not(&v)? });
                if *negated { not(&v)? } else { v }
            }
        })
    }
}

#[cfg(test)]
mod tests;
