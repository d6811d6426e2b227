package sluice.plan;

import org.apache.spark.sql.catalyst.expressions.Expression;
import org.apache.spark.sql.catalyst.expressions.Literal;
import org.apache.spark.sql.catalyst.rules.Rule;
import org.apache.spark.sql.execution.ColumnarRule;
import org.apache.spark.sql.execution.SparkPlan;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.TimestampNTZType;
import org.apache.spark.sql.types.TimestampType;
import scala.Function1;
import scala.runtime.AbstractPartialFunction;

/**
 * The physical-plan rule that puts a {@link HeldTimestamp} in place of every timestamp literal of a plan's operators,
 * so that their generated code does not change with the value (see {@link HeldTimestamp} for why). It runs as a
 * {@link ColumnarRule}'s first step, which Spark applies to every physical plan (a batch query's, each micro-batch's,
 * each adaptive stage's) before it collapses the plan into whole-stage code.
 *
 * <p>Scans keep their literals: a scan's pushed filters and partition filters are translated from literals, and a
 * filter must stay pushed. The filter that sits above a scan holds its own copy, which is held. {@value #ENABLED} set
 * to {@code false} in a session turns the rule off.
 */
public final class HoldTimestamps extends Rule<SparkPlan> {
  /** The session setting that turns the rule off when false (true by default). */
  public static final String ENABLED = "spark.sluice.holdTimestamps";

  /** As the first step of the columnar rules: Spark's hook into every physical plan before code generation. */
  public static final class Columnar extends ColumnarRule {
    private final HoldTimestamps rule = new HoldTimestamps();

    @Override
    public Rule<SparkPlan> preColumnarTransitions() {
      return rule;
    }
  }

  @Override
  public SparkPlan apply(SparkPlan plan) {
    if (!Boolean.parseBoolean(conf().getConfString(ENABLED, "true"))) {
      return plan;
    }
    return plan.transformUp(OPERATORS);
  }

  /** Whether {@code expression} is a timestamp literal that this rule holds. */
  static boolean held(Expression expression) {
    if (!(expression instanceof Literal literal) || literal.value() == null) {
      return false;
    }
    DataType type = literal.dataType();
    return type instanceof TimestampType || type instanceof TimestampNTZType;
  }

  private static final AbstractPartialFunction<Expression, Expression> LITERALS = new AbstractPartialFunction<>() {
    @Override
    public boolean isDefinedAt(Expression expression) {
      return held(expression);
    }

    @Override
    @SuppressWarnings("unchecked")
    public <E extends Expression, B> B applyOrElse(E expression, Function1<E, B> otherwise) {
      if (!held(expression)) {
        return otherwise.apply(expression);
      }
      Literal literal = (Literal) expression;
      return (B) new HeldTimestamp((Long) literal.value(), literal.dataType());
    }
  };

  // Every operator but the leaves (scans, local relations), whose expressions become pushed filters.
  private static final AbstractPartialFunction<SparkPlan, SparkPlan> OPERATORS = new AbstractPartialFunction<>() {
    @Override
    public boolean isDefinedAt(SparkPlan plan) {
      return !plan.children().isEmpty();
    }

    @Override
    @SuppressWarnings("unchecked")
    public <P extends SparkPlan, B> B applyOrElse(P plan, Function1<P, B> otherwise) {
      if (plan.children().isEmpty()) {
        return otherwise.apply(plan);
      }
      return (B) plan.transformExpressions(LITERALS);
    }
  };
}
