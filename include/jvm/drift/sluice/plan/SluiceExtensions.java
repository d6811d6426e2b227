package sluice.plan;

import org.apache.spark.sql.SparkSessionExtensions;
import scala.runtime.AbstractFunction1;
import scala.runtime.BoxedUnit;

/**
 * Sluice's session extensions ({@code spark.sql.extensions=sluice.plan.SluiceExtensions}, which Sluice gives every
 * Spark application that has its jar): {@link HoldTimestamps}, so that a stream's micro-batches share their generated
 * code instead of compiling it again for every batch's timestamp.
 */
public final class SluiceExtensions extends AbstractFunction1<SparkSessionExtensions, BoxedUnit> {
  @Override
  public BoxedUnit apply(SparkSessionExtensions extensions) {
    extensions.injectColumnar(session -> new HoldTimestamps.Columnar());
    return BoxedUnit.UNIT;
  }
}
