package sluice.plan;

import java.io.Serializable;
import org.apache.spark.sql.catalyst.InternalRow;
import org.apache.spark.sql.catalyst.expressions.Expression;
import org.apache.spark.sql.catalyst.expressions.Literal;
import org.apache.spark.sql.catalyst.expressions.codegen.CodegenContext;
import org.apache.spark.sql.catalyst.expressions.codegen.ExprCode;
import org.apache.spark.sql.catalyst.expressions.codegen.JavaCode;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.TimestampNTZType;
import org.apache.spark.sql.types.TimestampType;
import org.json4s.JValue;
import scala.Tuple2;
import scala.collection.immutable.IndexedSeq;
import scala.collection.immutable.List;
import scala.collection.immutable.Seq;
import scala.collection.immutable.Seq$;

/**
 * A timestamp literal whose value stays out of the generated Java source: the value {@link HoldTimestamps} puts in
 * place of a physical plan's timestamp {@link Literal}. Spark writes a timestamp literal into the generated code as
 * text ({@code 1764356400123456L}), so a query whose timestamp changes on every run (a micro-batch's {@code
 * current_timestamp()}, which Spark's {@code ComputeCurrentTime} turns into a literal) is new code every time: Janino
 * compiles new classes, and HotSpot compiles their methods again from the start. This one is a field of the
 * generated class, set from the {@code references} Spark passes it (as Spark holds a decimal or a string literal), so
 * the source is the same text whatever the value and Spark's code cache and HotSpot's compiled code serve every run.
 *
 * <p>Otherwise it is the literal: the same value, type, result and text in a plan's explanation; deterministic and
 * never null. It is not foldable, so no rule folds it back: it is made after the optimizer, for code generation only.
 * It extends {@link Expression} with no children rather than {@code LeafExpression}, which javac cannot extend (the
 * Scala trait's generic signatures clash in Java); so subexpression elimination may take it for a candidate, where
 * it costs a local variable.
 */
public final class HeldTimestamp extends Expression implements Serializable {
  private static final long serialVersionUID = 1L;
  private static final Seq<Expression> NO_CHILDREN = Seq$.MODULE$.empty();

  private final long micros;
  private final DataType type;

  /** {@code micros} since the epoch, of {@code type} ({@link TimestampType} or {@link TimestampNTZType}). */
  public HeldTimestamp(long micros, DataType type) {
    if (!(type instanceof TimestampType) && !(type instanceof TimestampNTZType)) {
      throw new IllegalArgumentException("a held timestamp is a TIMESTAMP or a TIMESTAMP_NTZ, not " + type);
    }
    this.micros = micros;
    this.type = type;
  }

  /** The held value: microseconds since the epoch. */
  public long micros() {
    return micros;
  }

  /** The literal this holds. */
  public Literal literal() {
    return new Literal(micros, type);
  }

  @Override
  public DataType dataType() {
    return type;
  }

  @Override
  public boolean nullable() {
    return false;
  }

  @Override
  public Object eval(InternalRow input) {
    return micros;
  }

  @Override
  public ExprCode doGenCode(CodegenContext ctx, ExprCode ev) {
    String reference = ctx.addReferenceObj("heldTimestamp", micros, "java.lang.Long");
    String field = ctx.addMutableState("long", "heldTimestamp",
        name -> name + " = " + reference + ".longValue();", true, true);
    return ExprCode.forNonNullValue(JavaCode.global(field, type));
  }

  @Override
  public String toString() {
    return literal().toString();
  }

  @Override
  public String sql() {
    return literal().sql();
  }

  @Override
  public List<Tuple2<String, JValue>> jsonFields() {
    return literal().jsonFields();
  }

  @Override
  public Seq<Expression> children() {
    return NO_CHILDREN;
  }

  @Override
  public Expression withNewChildrenInternal(IndexedSeq<Expression> children) {
    return this;
  }

  @Override
  public boolean equals(Object other) {
    return other instanceof HeldTimestamp held && held.micros == micros && held.type.equals(type);
  }

  @Override
  public int hashCode() {
    return 31 * type.hashCode() + Long.hashCode(micros);
  }

  @Override
  public int productArity() {
    return 2;
  }

  @Override
  public Object productElement(int n) {
    return switch (n) {
      case 0 -> micros;
      case 1 -> type;
      default -> throw new IndexOutOfBoundsException(n);
    };
  }

  @Override
  public boolean canEqual(Object other) {
    return other instanceof HeldTimestamp;
  }
}
