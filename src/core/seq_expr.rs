//! `sequence_by` expressions: SQL value expressions over source columns
//! (`coalesce(lsn, 0)`, `ts * 1000 + n`, `CAST(v AS long)`,
//! `greatest(seq, alt_seq)`), as Spark's AUTO CDC accepts for `sequence_by`.
//!
//! A flow gives each expression a hidden source column (see
//! `Flow::computed`), filled when a batch is read, so that everything past
//! the input (validation, resolving, the state, SCD Type 2 intervals) sees
//! one more sequence column and nothing else changes. The text is parsed
//! with `sqlparser` (the limits of `predicate` apply), typed at load time,
//! and evaluated with Arrow's checked kernels: an overflow, a division by
//! zero or a cast that does not hold fails the batch at its row.

use std::sync::Arc;

use arrow_arith::boolean::is_not_null;
use arrow_arith::numeric;
use arrow_array::{Array, ArrayRef, Datum, Scalar, UInt32Array, new_empty_array};
use arrow_cast::{CastOptions, can_cast_types, cast_with_options};
use arrow_schema::{ArrowError, DataType, Schema};
use sqlparser::ast::{
    BinaryOperator as B, CastKind, Expr, FunctionArg, FunctionArgExpr, FunctionArguments, Ident,
    UnaryOperator,
};

use super::predicate::{
    Lit, NumKind, PredicateError, describe, drop_expr, is_string, lit_array, literal, multipart,
    num_kind, num_kind_of_literal, parse_expr, resolve,
};

/// The most operators in one `sequence_by` expression: it is compiled and
/// evaluated by recursion, so this bounds the depth too.
pub const MAX_OPERATORS: usize = 256;

/// One part of a `sequence_by`: a plain column, or an expression. A
/// `struct(a, b, ...)` is its fields, compared in order (as a list would be).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    /// A column name, backtick-quoted when it was quoted.
    Column(String),
    Expr(String),
}

/// Splits a `sequence_by` entry that is not a column name into its parts.
pub fn parts(sql: &str) -> Result<Vec<Part>, PredicateError> {
    let expr = parse_expr(sql, MAX_OPERATORS)?;
    let fields = match &expr {
        Expr::Struct { values, fields } if fields.is_empty() => Some(values.iter().collect()),
        Expr::Function(f) if f.name.to_string().eq_ignore_ascii_case("struct") => {
            Some(function_args(sql, f)?)
        }
        _ => None,
    };
    let out = match fields {
        None => vec![Part::Expr(sql.trim().to_string())],
        Some(v) if v.is_empty() => {
            drop_expr(expr);
            return Err(PredicateError::Type {
                sql: sql.to_string(),
                message: "struct() has no fields; name the columns that order changes".into(),
            });
        }
        Some(v) => v
            .into_iter()
            .map(|e| match unnest(e) {
                Expr::Identifier(Ident {
                    value,
                    quote_style: Some('`'),
                    ..
                }) => Part::Column(format!("`{}`", value.replace('`', "``"))),
                Expr::Identifier(Ident { value, .. }) => Part::Column(value.clone()),
                e => Part::Expr(e.to_string()),
            })
            .collect(),
    };
    drop_expr(expr);
    Ok(out)
}

fn unnest(mut e: &Expr) -> &Expr {
    while let Expr::Nested(inner) = e {
        e = inner;
    }
    e
}

/// The plain arguments of a function call.
fn function_args<'a>(
    sql: &str,
    f: &'a sqlparser::ast::Function,
) -> Result<Vec<&'a Expr>, PredicateError> {
    let unsupported = || PredicateError::UnsupportedValue {
        sql: sql.to_string(),
        construct: format!("the call `{f}` (plain arguments only)"),
    };
    if f.over.is_some()
        || f.filter.is_some()
        || f.null_treatment.is_some()
        || !f.within_group.is_empty()
        || !matches!(f.parameters, FunctionArguments::None)
    {
        return Err(unsupported());
    }
    match &f.args {
        FunctionArguments::List(list)
            if list.duplicate_treatment.is_none() && list.clauses.is_empty() =>
        {
            list.args
                .iter()
                .map(|a| match a {
                    FunctionArg::Unnamed(FunctionArgExpr::Expr(e)) => Ok(e),
                    _ => Err(unsupported()),
                })
                .collect()
        }
        FunctionArguments::None => Ok(Vec::new()),
        _ => Err(unsupported()),
    }
}

/// A typed, compiled `sequence_by` expression. Column indices are source
/// column indices (positions in the schema it was compiled against).
#[derive(Debug, Clone)]
pub struct SeqExpr {
    sql: String,
    root: Node,
    ty: DataType,
}

#[derive(Debug, Clone)]
enum Node {
    Column(usize),
    /// A one-element array.
    Literal(ArrayRef),
    /// `safe`: a value that does not convert is null (TRY_CAST).
    Cast(Box<Node>, DataType, bool),
    Arith(Op, Box<Node>, Box<Node>),
    Neg(Box<Node>),
    Coalesce(Vec<Node>),
    /// `greatest(...)` (true) or `least(...)` (false): Spark's, nulls
    /// skipped, null only where every argument is.
    Extreme(bool, Vec<Node>),
}

impl Node {
    fn reads_a_column(&self) -> bool {
        match self {
            Node::Column(_) => true,
            Node::Literal(_) => false,
            Node::Cast(n, ..) | Node::Neg(n) => n.reads_a_column(),
            Node::Arith(_, l, r) => l.reads_a_column() || r.reads_a_column(),
            Node::Coalesce(v) | Node::Extreme(_, v) => v.iter().any(Node::reads_a_column),
        }
    }
}

#[derive(Debug, Clone, Copy)]
enum Op {
    Add,
    Sub,
    Mul,
    Div,
    Rem,
}

impl Op {
    fn kernel(self) -> fn(&dyn Datum, &dyn Datum) -> Result<ArrayRef, ArrowError> {
        match self {
            Op::Add => numeric::add,
            Op::Sub => numeric::sub,
            Op::Mul => numeric::mul,
            Op::Div => numeric::div,
            Op::Rem => numeric::rem,
        }
    }
}

/// A compiled operand: a typed node, or a literal whose type its use decides.
enum Val {
    Node(Node, DataType),
    Lit(Lit),
}

/// Numbers as arithmetic sees them.
#[derive(Clone, Copy, PartialEq)]
enum Num {
    Int,
    Dec(u8, i8),
    Float,
}

fn num_of_type(t: &DataType) -> Option<Num> {
    match t {
        DataType::Int8 | DataType::Int16 | DataType::Int32 | DataType::Int64 => Some(Num::Int),
        DataType::Decimal128(p, s) => Some(Num::Dec(*p, *s)),
        DataType::Float16 | DataType::Float32 | DataType::Float64 => Some(Num::Float),
        _ => None,
    }
}

fn num_of_literal(n: &str) -> Option<Num> {
    Some(match num_kind_of_literal(n)? {
        NumKind::Fixed(i, 0) if i <= 18 => Num::Int,
        NumKind::Fixed(i, s) if i as u16 + s as u16 <= 38 => Num::Dec(i + s, s as i8),
        _ => Num::Float,
    })
}

/// The type an operand of kind `k` (of type `own`, if a column) is computed in.
fn operand_type(k: Num, own: Option<&DataType>, wide: Num) -> DataType {
    match (wide, k) {
        (Num::Float, _) => DataType::Float64,
        (Num::Int, _) => DataType::Int64,
        (Num::Dec(..), Num::Dec(p, s)) => DataType::Decimal128(p.max(1), s),
        (Num::Dec(..), _) => match own {
            Some(DataType::Int32 | DataType::Int16 | DataType::Int8) => DataType::Decimal128(10, 0),
            _ => DataType::Decimal128(19, 0),
        },
    }
}

/// The wider of two kinds: any float makes a float, any decimal a decimal.
fn wider(a: Num, b: Num) -> Num {
    match (a, b) {
        (Num::Float, _) | (_, Num::Float) => Num::Float,
        (Num::Dec(..), _) => a,
        (_, Num::Dec(..)) => b,
        _ => Num::Int,
    }
}

struct Compiler<'a> {
    sql: &'a str,
    schema: &'a Schema,
    /// The Arrow type of a column type name (`long`, `decimal(10,2)`, ...).
    type_of: &'a dyn Fn(&str) -> Option<DataType>,
}

impl SeqExpr {
    /// Compiles `sql` against `schema` (the declared source columns).
    /// `type_of` reads a column type name, for `CAST(x AS name)`.
    pub fn compile(
        sql: &str,
        schema: &Schema,
        type_of: &dyn Fn(&str) -> Option<DataType>,
    ) -> Result<SeqExpr, PredicateError> {
        let expr = parse_expr(sql, MAX_OPERATORS)?;
        let c = Compiler {
            sql,
            schema,
            type_of,
        };
        let root = c.value(&expr);
        drop_expr(expr);
        match root? {
            Val::Node(root, ty) if root.reads_a_column() => Ok(SeqExpr {
                sql: sql.to_string(),
                root,
                ty,
            }),
            _ => Err(c.type_err(
                "it is a constant; a sequence must come from each change's columns".into(),
            )),
        }
    }

    pub fn sql(&self) -> &str {
        &self.sql
    }

    /// The Arrow type the expression yields.
    pub fn data_type(&self) -> &DataType {
        &self.ty
    }

    /// The value of each of `rows` rows of `cols` (the source columns), as
    /// type `want`. On failure: the first row that fails, and why.
    pub fn evaluate(
        &self,
        cols: &[ArrayRef],
        rows: usize,
        want: &DataType,
    ) -> Result<ArrayRef, (usize, String)> {
        self.evaluate_all(cols, rows, want).map_err(|e| {
            let row = self.first_failing(cols, 0, rows, want);
            (row, e.to_string())
        })
    }

    fn evaluate_all(
        &self,
        cols: &[ArrayRef],
        rows: usize,
        want: &DataType,
    ) -> Result<ArrayRef, ArrowError> {
        let out = match eval(&self.root, cols)? {
            Out::Array(a) => a,
            Out::Scalar(a) => {
                arrow_select::take::take(&a, &UInt32Array::from(vec![0u32; rows]), None)?
            }
        };
        let strict = CastOptions {
            safe: false,
            ..Default::default()
        };
        let out = if out.data_type() == want {
            out
        } else {
            cast_with_options(&out, want, &strict)?
        };
        if let DataType::Decimal128(p, _) = want {
            use arrow_array::cast::AsArray;
            out.as_primitive::<arrow_array::types::Decimal128Type>()
                .validate_decimal_precision(*p)?;
        }
        Ok(out)
    }

    /// The first row in `[at, at + len)` the expression fails on, by halves
    /// (about two evaluations of the batch in all).
    fn first_failing(&self, cols: &[ArrayRef], at: usize, len: usize, want: &DataType) -> usize {
        if len <= 1 {
            return at;
        }
        let half = len / 2;
        let slice: Vec<ArrayRef> = cols.iter().map(|c| c.slice(at, half)).collect();
        if self.evaluate_all(&slice, half, want).is_err() {
            self.first_failing(cols, at, half, want)
        } else {
            self.first_failing(cols, at + half, len - half, want)
        }
    }
}

impl Compiler<'_> {
    fn type_err(&self, message: String) -> PredicateError {
        PredicateError::Type {
            sql: self.sql.to_string(),
            message,
        }
    }

    fn unsupported(&self, construct: String) -> PredicateError {
        PredicateError::UnsupportedValue {
            sql: self.sql.to_string(),
            construct,
        }
    }

    fn value(&self, e: &Expr) -> Result<Val, PredicateError> {
        match e {
            Expr::Nested(inner) => self.value(inner),
            Expr::Identifier(ident) => {
                let i = resolve(self.sql, self.schema, ident)?;
                Ok(Val::Node(
                    Node::Column(i),
                    self.schema.field(i).data_type().clone(),
                ))
            }
            Expr::CompoundIdentifier(parts) => Err(multipart(self.sql, parts)),
            Expr::Value(v) => literal(&v.value)
                .map(Val::Lit)
                .ok_or_else(|| self.unsupported(format!("the literal `{v}`"))),
            Expr::UnaryOp {
                op: op @ (UnaryOperator::Minus | UnaryOperator::Plus),
                expr,
            } => {
                let minus = *op == UnaryOperator::Minus;
                match self.value(expr)? {
                    Val::Lit(Lit::Num(n)) if minus => Ok(Val::Lit(Lit::Num(
                        n.strip_prefix('-')
                            .map_or_else(|| format!("-{n}"), str::to_string),
                    ))),
                    v @ Val::Lit(Lit::Num(_) | Lit::Null) => Ok(v),
                    Val::Node(n, ty) if num_of_type(&ty).is_some() => Ok(if minus {
                        Val::Node(Node::Neg(Box::new(n)), ty)
                    } else {
                        Val::Node(n, ty)
                    }),
                    _ => Err(self.type_err(format!("`{e}` needs a number"))),
                }
            }
            Expr::BinaryOp { left, op, right } => {
                let op = match op {
                    B::Plus => Op::Add,
                    B::Minus => Op::Sub,
                    B::Multiply => Op::Mul,
                    B::Divide => Op::Div,
                    B::Modulo => Op::Rem,
                    other => return Err(self.unsupported(format!("the operator `{other}`"))),
                };
                self.arith(e, op, left, right)
            }
            Expr::Cast {
                kind,
                expr,
                data_type,
                format: None,
            } => {
                let safe = match kind {
                    CastKind::TryCast | CastKind::SafeCast => true,
                    CastKind::Cast | CastKind::DoubleColon => false,
                };
                self.cast(e, expr, &data_type.to_string(), safe)
            }
            Expr::Function(f) => {
                let name = f.name.to_string().to_ascii_lowercase();
                let args = function_args(self.sql, f)?;
                match name.as_str() {
                    "coalesce" | "ifnull" | "nvl" => {
                        if args.is_empty() || (name != "coalesce" && args.len() != 2) {
                            return Err(self.type_err(format!(
                                "`{e}` needs {} arguments",
                                if name == "coalesce" {
                                    "one or more"
                                } else {
                                    "two"
                                }
                            )));
                        }
                        let (nodes, ty) = self.common(e, &args)?;
                        Ok(Val::Node(Node::Coalesce(nodes), ty))
                    }
                    "greatest" | "least" => {
                        if args.len() < 2 {
                            return Err(self.type_err(format!("`{e}` needs two or more arguments")));
                        }
                        let (nodes, ty) = self.common(e, &args)?;
                        Ok(Val::Node(Node::Extreme(name == "greatest", nodes), ty))
                    }
                    "struct" => Err(self.struct_inside(e)),
                    _ => Err(self.unsupported(format!("the function `{}`", f.name))),
                }
            }
            Expr::Struct { .. } => Err(self.struct_inside(e)),
            other => Err(self.unsupported(describe(other))),
        }
    }

    fn struct_inside(&self, e: &Expr) -> PredicateError {
        self.unsupported(format!(
            "`{e}` inside an expression (struct(...) may only be the whole sequence_by)"
        ))
    }

    /// A literal as type `ty`, or a type error naming both.
    fn literal(&self, lit: &Lit, ty: &DataType, e: &Expr) -> Result<Node, PredicateError> {
        lit_array(lit, ty)
            .map(Node::Literal)
            .map_err(|err| self.type_err(format!("cannot use `{e}` as {ty}: {err}")))
    }

    /// `v` as a node of type `ty` (cast when its own type differs).
    fn coerce(&self, v: Val, ty: &DataType, e: &Expr) -> Result<Node, PredicateError> {
        match v {
            Val::Lit(l) => self.literal(&l, ty, e),
            Val::Node(n, own) if own == *ty => Ok(n),
            Val::Node(n, own) if can_cast_types(&own, ty) => {
                Ok(Node::Cast(Box::new(n), ty.clone(), false))
            }
            Val::Node(_, own) => Err(self.type_err(format!("cannot read {own} as {ty} in `{e}`"))),
        }
    }

    fn arith(&self, e: &Expr, op: Op, l: &Expr, r: &Expr) -> Result<Val, PredicateError> {
        let (lv, rv) = (self.value(l)?, self.value(r)?);
        let kind = |v: &Val, side: &Expr| -> Result<Option<Num>, PredicateError> {
            match v {
                Val::Lit(Lit::Null) => Ok(None),
                Val::Lit(Lit::Num(n)) => num_of_literal(n)
                    .map(Some)
                    .ok_or_else(|| self.type_err(format!("`{side}` is not a number"))),
                Val::Node(_, t) => num_of_type(t).map(Some).ok_or_else(|| {
                    self.type_err(format!(
                        "`{e}` needs numbers but `{side}` is {t}; CAST it to a number first"
                    ))
                }),
                Val::Lit(_) => {
                    Err(self.type_err(format!("`{e}` needs numbers but `{side}` is not one")))
                }
            }
        };
        let (lk, rk) = (kind(&lv, l)?, kind(&rv, r)?);
        let wide = match (lk, rk) {
            _ if matches!(op, Op::Div) => Num::Float,
            (Some(a), Some(b)) => wider(a, b),
            (Some(a), None) | (None, Some(a)) => a,
            (None, None) => Num::Int,
        };
        let own = |v: &Val| match v {
            Val::Node(_, t) => Some(t.clone()),
            Val::Lit(_) => None,
        };
        let lt = operand_type(lk.unwrap_or(wide), own(&lv).as_ref(), wide);
        let rt = operand_type(rk.unwrap_or(wide), own(&rv).as_ref(), wide);
        let (ln, rn) = (self.coerce(lv, &lt, l)?, self.coerce(rv, &rt, r)?);
        // The result's type, as the kernel gives it (decimal precision and scale).
        let ty = op.kernel()(&new_empty_array(&lt), &new_empty_array(&rt))
            .map_err(|err| self.type_err(format!("`{e}`: {err}")))?
            .data_type()
            .clone();
        Ok(Val::Node(Node::Arith(op, Box::new(ln), Box::new(rn)), ty))
    }

    fn cast(&self, e: &Expr, inner: &Expr, to: &str, safe: bool) -> Result<Val, PredicateError> {
        let Some(ty) = (self.type_of)(to) else {
            return Err(self.type_err(format!(
                "`{e}` casts to {to}; cast to a column type (int, long, float, double, decimal(p,s), date, time, timestamp, timestamptz, string)"
            )));
        };
        Ok(match self.value(inner)? {
            Val::Lit(l) => Val::Node(self.literal(&l, &ty, e)?, ty),
            Val::Node(n, own) if can_cast_types(&own, &ty) => {
                Val::Node(Node::Cast(Box::new(n), ty.clone(), safe), ty)
            }
            Val::Node(_, own) => {
                return Err(self.type_err(format!("`{e}`: {own} does not cast to {ty}")));
            }
        })
    }

    /// The arguments of `coalesce`, `greatest` or `least`, in their common
    /// type (strings, or the widest number).
    fn common(&self, e: &Expr, args: &[&Expr]) -> Result<(Vec<Node>, DataType), PredicateError> {
        let vals = args
            .iter()
            .map(|a| self.value(a))
            .collect::<Result<Vec<_>, _>>()?;
        let mut common: Option<DataType> = None;
        for v in &vals {
            let Val::Node(_, t) = v else { continue };
            common = Some(match common {
                None => t.clone(),
                Some(c) if c == *t => c,
                Some(c) if is_string(&c) && is_string(t) => DataType::LargeUtf8,
                Some(c) => match (num_of_type(&c), num_of_type(t)) {
                    (Some(a), Some(b)) => match wider(a, b) {
                        Num::Int => DataType::Int64,
                        Num::Float => DataType::Float64,
                        Num::Dec(..) => {
                            let digits = |t: &DataType| match num_kind(t) {
                                Some(NumKind::Fixed(i, s)) => (i, s),
                                _ => (19, 0),
                            };
                            let ((ai, as_), (bi, bs)) = (digits(&c), digits(t));
                            let s = as_.max(bs);
                            DataType::Decimal128((ai.max(bi) + s).min(38), s as i8)
                        }
                    },
                    _ => {
                        return Err(self.type_err(format!(
                            "`{e}` mixes {c} and {t}; CAST the arguments to one type"
                        )));
                    }
                },
            });
        }
        let Some(ty) = common else {
            return Err(self.type_err(format!(
                "`{e}` has only constants; a sequence must come from each change's columns"
            )));
        };
        let nodes = vals
            .into_iter()
            .zip(args)
            .map(|(v, a)| self.coerce(v, &ty, a))
            .collect::<Result<Vec<_>, _>>()?;
        Ok((nodes, ty))
    }
}

/// A value while evaluating: a column-long array, or a one-row constant.
enum Out {
    Array(ArrayRef),
    Scalar(ArrayRef),
}

impl Out {
    fn datum(&self) -> Box<dyn Datum> {
        match self {
            Out::Array(a) => Box::new(Arc::clone(a)),
            Out::Scalar(a) => Box::new(Scalar::new(Arc::clone(a))),
        }
    }

    fn map(self, f: impl Fn(&ArrayRef) -> Result<ArrayRef, ArrowError>) -> Result<Out, ArrowError> {
        Ok(match self {
            Out::Array(a) => Out::Array(f(&a)?),
            Out::Scalar(a) => Out::Scalar(f(&a)?),
        })
    }
}

fn eval(n: &Node, cols: &[ArrayRef]) -> Result<Out, ArrowError> {
    Ok(match n {
        Node::Column(i) => {
            Out::Array(Arc::clone(cols.get(*i).ok_or_else(|| {
                ArrowError::InvalidArgumentError(format!("column #{i} is missing"))
            })?))
        }
        Node::Literal(a) => Out::Scalar(Arc::clone(a)),
        Node::Cast(inner, to, safe) => eval(inner, cols)?.map(|a| {
            let opts = CastOptions {
                safe: *safe,
                ..Default::default()
            };
            cast_with_options(a, to, &opts)
        })?,
        Node::Neg(inner) => eval(inner, cols)?.map(|a| numeric::neg(a))?,
        Node::Arith(op, l, r) => {
            let (l, r) = (eval(l, cols)?, eval(r, cols)?);
            let both_scalar = matches!((&l, &r), (Out::Scalar(_), Out::Scalar(_)));
            let out = op.kernel()(l.datum().as_ref(), r.datum().as_ref())?;
            if both_scalar {
                Out::Scalar(out)
            } else {
                Out::Array(out)
            }
        }
        Node::Coalesce(args) => {
            // From the right: each argument, where it is not null, over the rest.
            let mut acc: Option<Out> = None;
            for a in args.iter().rev() {
                let v = eval(a, cols)?;
                acc = Some(match (v, acc) {
                    (v, None) => v,
                    (Out::Scalar(s), Some(rest)) => {
                        if s.is_null(0) {
                            rest
                        } else {
                            Out::Scalar(s)
                        }
                    }
                    (Out::Array(a), Some(rest)) => {
                        let mask = is_not_null(&a)?;
                        Out::Array(arrow_select::zip::zip(&mask, &a, rest.datum().as_ref())?)
                    }
                });
            }
            acc.ok_or_else(|| ArrowError::InvalidArgumentError("coalesce()".into()))?
        }
        Node::Extreme(greatest, args) => {
            let mut acc: Option<Out> = None;
            for a in args {
                let v = eval(a, cols)?;
                acc = Some(match acc {
                    None => v,
                    Some(cur) => extreme(*greatest, cur, v)?,
                });
            }
            acc.ok_or_else(|| ArrowError::InvalidArgumentError("greatest()".into()))?
        }
    })
}

/// Per row, `v` where it is the greater (`greatest`) or lesser of the two
/// or `cur` is null, else `cur`: a null never wins over a value. NaN is
/// above every number, as in Spark.
fn extreme(greatest: bool, cur: Out, v: Out) -> Result<Out, ArrowError> {
    use arrow_ord::cmp;
    let both_scalar = matches!((&cur, &v), (Out::Scalar(_), Out::Scalar(_)));
    let (cd, vd) = (cur.datum(), v.datum());
    let better = if greatest {
        cmp::gt(vd.as_ref(), cd.as_ref())?
    } else {
        cmp::lt(vd.as_ref(), cd.as_ref())?
    };
    let valid = |o: &Out, i: usize| match o {
        Out::Array(a) => a.is_valid(i),
        Out::Scalar(a) => a.is_valid(0),
    };
    let mask: arrow_array::BooleanArray = (0..better.len())
        .map(|i| {
            Some(match (valid(&cur, i), valid(&v, i)) {
                (false, _) => true,
                (true, false) => false,
                (true, true) => better.value(i),
            })
        })
        .collect();
    let out = arrow_select::zip::zip(&mask, vd.as_ref(), cd.as_ref())?;
    Ok(if both_scalar {
        Out::Scalar(out)
    } else {
        Out::Array(out)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow_array::{Int32Array, Int64Array, StringArray};
    use arrow_schema::Field;

    fn type_of(name: &str) -> Option<DataType> {
        Some(match name.to_ascii_lowercase().as_str() {
            "long" | "bigint" => DataType::Int64,
            "int" => DataType::Int32,
            "double" => DataType::Float64,
            "string" => DataType::Utf8,
            _ => return None,
        })
    }

    fn schema() -> Schema {
        Schema::new(vec![
            Field::new("ts", DataType::Int64, true),
            Field::new("n", DataType::Int32, true),
            Field::new("lsn", DataType::Int64, true),
            Field::new("s", DataType::Utf8, true),
            Field::new("big", DataType::Int64, true),
        ])
    }

    fn cols() -> Vec<ArrayRef> {
        let strings = StringArray::from(vec![Some("5"), Some("x"), None, Some("8")]);
        vec![
            Arc::new(Int64Array::from(vec![Some(1), Some(2), None, Some(4)])),
            Arc::new(Int32Array::from(vec![Some(7), None, Some(3), Some(1)])),
            Arc::new(Int64Array::from(vec![None, Some(20), None, Some(40)])),
            Arc::new(strings),
            Arc::new(Int64Array::from(vec![
                Some(0),
                None,
                Some(1),
                Some(i64::MAX),
            ])),
        ]
    }

    fn compile(sql: &str) -> Result<SeqExpr, PredicateError> {
        SeqExpr::compile(sql, &schema(), &type_of)
    }

    /// The values of `sql` over `cols()`, as longs.
    fn longs(sql: &str) -> Result<Vec<Option<i64>>, (usize, String)> {
        let e = compile(sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
        let out = e.evaluate(&cols(), 4, &DataType::Int64)?;
        use arrow_array::cast::AsArray;
        Ok(out
            .as_primitive::<arrow_array::types::Int64Type>()
            .iter()
            .collect())
    }

    #[test]
    fn arithmetic_over_columns_and_literals() {
        assert_eq!(
            longs("ts * 1000 + n").unwrap()[..3],
            [Some(1007), None, None]
        );
        assert_eq!(longs("-ts").unwrap()[..2], [Some(-1), Some(-2)]);
        assert_eq!(longs("(n % 2) + 1").unwrap()[..3], [Some(2), None, Some(2)]);
        assert_eq!(
            compile("ts * 1000 + n").unwrap().data_type(),
            &DataType::Int64
        );
        assert_eq!(compile("n / 2").unwrap().data_type(), &DataType::Float64);
    }

    #[test]
    fn coalesce_takes_the_first_value_that_is_there() {
        assert_eq!(
            longs("coalesce(lsn, ts, 0)").unwrap(),
            [Some(1), Some(20), Some(0), Some(40)]
        );
        assert_eq!(
            longs("coalesce(lsn, 5)").unwrap(),
            [Some(5), Some(20), Some(5), Some(40)]
        );
        assert_eq!(
            longs("ifnull(lsn, n)").unwrap(),
            [Some(7), Some(20), Some(3), Some(40)]
        );
        // A column of int and a long: long.
        assert_eq!(compile("nvl(n, ts)").unwrap().data_type(), &DataType::Int64);
        assert_eq!(
            compile("coalesce(n, 0)").unwrap().data_type(),
            &DataType::Int32
        );
    }

    #[test]
    fn greatest_and_least_skip_nulls_as_spark_does() {
        assert_eq!(
            longs("greatest(ts, n)").unwrap(),
            [Some(7), Some(2), Some(3), Some(4)]
        );
        assert_eq!(
            longs("least(ts, n)").unwrap(),
            [Some(1), Some(2), Some(3), Some(1)]
        );
        // Null only where every argument is.
        assert_eq!(
            longs("greatest(lsn, ts)").unwrap(),
            [Some(1), Some(20), None, Some(40)]
        );
        assert_eq!(
            longs("greatest(lsn, ts, n)").unwrap(),
            [Some(7), Some(20), Some(3), Some(40)]
        );
        assert_eq!(
            longs("least(lsn, 5)").unwrap(),
            [Some(5), Some(5), Some(5), Some(5)]
        );
        assert_eq!(
            longs("GREATEST(lsn, 30)").unwrap(),
            [Some(30), Some(30), Some(30), Some(40)]
        );
        // The arguments' common type; one argument, or only constants, is refused.
        assert_eq!(
            compile("greatest(n, ts)").unwrap().data_type(),
            &DataType::Int64
        );
        assert!(compile("greatest(ts)").is_err());
        assert!(compile("least(1, 2)").is_err());
        assert!(compile("greatest(s, ts)").is_err());
    }

    #[test]
    fn casts_strict_and_try() {
        assert_eq!(
            longs("try_cast(s AS long)").unwrap(),
            [Some(5), None, None, Some(8)]
        );
        // `x` is no number: the batch fails at that row.
        let (row, why) = longs("cast(s AS bigint)").unwrap_err();
        assert_eq!(row, 1, "{why}");
    }

    #[test]
    fn an_overflow_names_its_row() {
        let (row, why) = longs("big * 1000").unwrap_err();
        assert_eq!(row, 3);
        assert!(why.contains("verflow"), "{why}");
    }

    #[test]
    fn refused_at_load() {
        let code = |sql: &str| compile(sql).map(|_| ()).unwrap_err().code();
        use super::super::predicate::codes;
        assert_eq!(code("s + 1"), codes::TYPE);
        assert_eq!(code("coalesce(s, ts)"), codes::TYPE);
        assert_eq!(code("1 + 2"), codes::TYPE);
        assert_eq!(code("coalesce(NULL, 2)"), codes::TYPE);
        assert_eq!(code("cast(ts AS geometry)"), codes::TYPE);
        assert_eq!(code("ts / 0 > 1"), codes::UNSUPPORTED);
        assert_eq!(code("upper(s)"), codes::UNSUPPORTED);
        assert_eq!(code("ts + struct(n)"), codes::UNSUPPORTED);
        assert_eq!(code("cast(ts AS geometry)"), codes::TYPE);
        assert_eq!(code("nope + 1"), codes::UNKNOWN_COLUMN);
        assert_eq!(code("t.ts + 1"), codes::MULTIPART);
        assert_eq!(code("ts +"), codes::PARSE);
        let long = vec!["ts"; MAX_OPERATORS + 2].join(" + ");
        assert_eq!(code(&long), codes::TOO_LARGE);
        assert!(compile(&vec!["ts"; MAX_OPERATORS / 2].join(" + ")).is_ok());
    }

    #[test]
    fn struct_is_its_fields() {
        assert_eq!(
            parts("struct(ts, `a.b`, lsn + 1)").unwrap(),
            vec![
                Part::Column("ts".into()),
                Part::Column("`a.b`".into()),
                Part::Expr("lsn + 1".into())
            ]
        );
        assert_eq!(
            parts("coalesce(lsn, 0)").unwrap(),
            vec![Part::Expr("coalesce(lsn, 0)".into())]
        );
        assert!(parts("struct()").is_err());
    }
}
