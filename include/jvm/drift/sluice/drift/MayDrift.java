package sluice.drift;

import com.fasterxml.jackson.core.JsonFactory;
import com.fasterxml.jackson.core.JsonParser;
import com.fasterxml.jackson.core.JsonToken;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.HashSet;
import java.util.Map;
import java.util.Set;
import org.apache.spark.sql.api.java.UDF2;
import org.apache.spark.sql.types.ArrayType;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.MapType;
import org.apache.spark.sql.types.StringType;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;

/**
 * Whether a JSON record may hold something that Spark's typed parse of it dropped: {@code may_drift(text, ddl)} is
 * false only for a record whose every key, at any depth, is a field its struct declares (matched exactly, as Spark's
 * JSON parser matches them), given once, inside one object that the VARIANT's parser reads as Spark's typed parser
 * does; true for anything else (a new key, a key given twice at any depth, text that is no single object, text that
 * this parser refuses, or too big for a VARIANT). Sluice parses only the records it is true for a second time, as a
 * VARIANT, and walks them (sluice_spark.drift.fields; under {@code rescue}, {@link Rescue}): a record it is false for
 * has nothing to rescue but its misfits, which Spark's typed parse flags itself.
 *
 * <p>One streaming pass over the record's tokens, which stops at the first doubt; a clean record allocates nothing
 * beyond its tokens. {@code ddl} is the declared schema as Spark's DDL, the same text for every row of a query: it is
 * read once per instance.
 */
public final class MayDrift implements UDF2<String, String, Boolean> {
  private static final long serialVersionUID = 1L;
  // The VARIANT parser's factory: the same defaults, so this refuses what it refuses.
  private static final JsonFactory FACTORY = new JsonFactory();
  /** Bigger records are parsed as a VARIANT whatever they hold: the VARIANT's size limit may refuse them. */
  static final int ALWAYS_CHECKED_BYTES = 1 << 20;

  /** The declared shape at one place of a record; null for a value whose keys are nobody's (a scalar's). */
  private static final class Shape {
    final Map<String, Integer> index = new HashMap<>();
    Shape[] fields;  // a struct's, by index
    Shape element;  // an array's
    boolean map;  // a map with string keys, whose values are `element`
  }

  private transient volatile String cachedDdl;
  private transient volatile Shape cachedShape;

  @Override
  public Boolean call(String text, String ddl) {
    if (text == null) {
      return Boolean.FALSE;  // no record: Spark's typed parse says so itself
    }
    Shape root = shape(ddl);
    int length = text.length();
    if (length == 0 || text.charAt(0) != '{' || text.charAt(length - 1) != '}' || tooBig(text)) {
      return Boolean.TRUE;
    }
    try (JsonParser parser = FACTORY.createParser(text)) {
      if (parser.nextToken() != JsonToken.START_OBJECT || drifts(parser, root)) {
        return Boolean.TRUE;
      }
      return parser.nextToken() != null;
    } catch (IOException | RuntimeException refused) {
      return Boolean.TRUE;
    }
  }

  private static boolean tooBig(String text) {
    int length = text.length();
    if ((long) length * 3 <= ALWAYS_CHECKED_BYTES) {
      return false;  // a UTF-16 unit is at most three bytes of UTF-8
    }
    return length > ALWAYS_CHECKED_BYTES || text.getBytes(StandardCharsets.UTF_8).length > ALWAYS_CHECKED_BYTES;
  }

  private Shape shape(String ddl) {
    String known = cachedDdl;
    Shape shape = cachedShape;
    if (shape != null && (known == ddl || ddl.equals(known))) {
      return shape;
    }
    shape = of(StructType.fromDDL(ddl));
    cachedShape = shape;
    cachedDdl = ddl;
    return shape;
  }

  private static Shape of(DataType type) {
    if (type instanceof StructType struct) {
      Shape shape = new Shape();
      StructField[] fields = struct.fields();
      shape.fields = new Shape[fields.length];
      for (int i = 0; i < fields.length; i++) {
        shape.index.putIfAbsent(fields[i].name(), i);
        shape.fields[i] = of(fields[i].dataType());
      }
      return shape;
    }
    if (type instanceof ArrayType array) {
      Shape element = of(array.elementType());
      if (element == null) {
        return null;
      }
      Shape shape = new Shape();
      shape.element = element;
      return shape;
    }
    if (type instanceof MapType map && map.keyType() instanceof StringType) {
      Shape value = of(map.valueType());
      if (value == null) {
        return null;
      }
      Shape shape = new Shape();
      shape.map = true;
      shape.element = value;
      return shape;
    }
    return null;
  }

  /**
   * Whether the value at the parser's current token may hold something its declared {@code shape} dropped. A value
   * of another shape than the declared one is a misfit, which Spark's typed parse flags: only its keys given twice
   * are looked for, as in a value whose keys are nobody's.
   */
  private static boolean drifts(JsonParser parser, Shape shape) throws IOException {
    JsonToken token = parser.currentToken();
    if (token == null) {
      return true;  // the text ended inside a value
    }
    if (token == JsonToken.START_OBJECT) {
      if (shape != null && shape.fields != null) {
        boolean[] seen = new boolean[shape.fields.length];
        while (parser.nextToken() == JsonToken.FIELD_NAME) {
          Integer field = shape.index.get(parser.currentName());
          if (field == null || seen[field]) {
            return true;
          }
          seen[field] = true;
          parser.nextToken();
          if (drifts(parser, shape.fields[field])) {
            return true;
          }
        }
        return parser.currentToken() != JsonToken.END_OBJECT;
      }
      Shape values = shape != null && shape.map ? shape.element : null;
      Set<String> keys = null;
      while (parser.nextToken() == JsonToken.FIELD_NAME) {
        if (keys == null) {
          keys = new HashSet<>();
        }
        if (!keys.add(parser.currentName())) {
          return true;
        }
        parser.nextToken();
        if (drifts(parser, values)) {
          return true;
        }
      }
      return parser.currentToken() != JsonToken.END_OBJECT;
    }
    if (token == JsonToken.START_ARRAY) {
      Shape element = shape != null && !shape.map && shape.fields == null ? shape.element : null;
      while (parser.nextToken() != JsonToken.END_ARRAY) {
        if (parser.currentToken() == null || drifts(parser, element)) {
          return true;
        }
      }
      return false;
    }
    return false;
  }
}
