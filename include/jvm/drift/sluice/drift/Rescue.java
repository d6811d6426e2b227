package sluice.drift;

import com.fasterxml.jackson.core.JsonFactory;
import com.fasterxml.jackson.core.JsonGenerator;
import java.io.IOException;
import java.io.StringWriter;
import java.io.UncheckedIOException;
import java.time.ZoneId;
import java.time.ZoneOffset;
import java.util.ArrayList;
import java.util.List;
import java.util.regex.Pattern;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.api.java.UDF4;
import org.apache.spark.sql.types.ArrayType;
import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.MapType;
import org.apache.spark.sql.types.StringType;
import org.apache.spark.sql.types.StructField;
import org.apache.spark.sql.types.StructType;
import org.apache.spark.types.variant.Variant;
import org.apache.spark.types.variant.VariantBuilder;
import org.apache.spark.types.variant.VariantUtil;

/**
 * A JSON record's {@code _rescued_data} under the {@code rescue} policy, for the records that {@link MayDrift} (or
 * Spark's typed parse) flagged: {@code rescue(text, typed, rejected, ddl)}. It stands in for the VARIANT parse and
 * the column-expression walk of {@code sluice_spark.drift.fields} (which the other policies keep), step for step, so
 * that no projection of the query holds a higher-order function and the whole plan after the typed parse is Spark's
 * generated code: the record is parsed by the VARIANT's own parser (the same call as {@code try_parse_json}), its
 * values are written by the VARIANT's own {@code toJson} and its keys by Jackson, as {@code to_json} writes a
 * {@code MAP<STRING, VARIANT>}; so the bytes are the same.
 *
 * <p>{@code typed} is the record's typed columns (Spark's typed parse, as a struct of the declared fields), {@code
 * rejected} whether that parse flagged the record, {@code ddl} the declared schema. Returns NULL for a record the
 * VARIANT's parser refuses or that is no object (a dead letter); "" when nothing is rescued; else the JSON object of
 * the new fields' and misfits' paths and values.
 */
public final class Rescue implements UDF4<String, Row, Boolean, String, String> {
  private static final long serialVersionUID = 1L;
  private static final JsonFactory FACTORY = new JsonFactory();
  /** A key that needs no backticks in a path: sluice.model.types.IDENTIFIER, matched as Spark's RLIKE matches. */
  private static final Pattern IDENTIFIER = Pattern.compile("^[A-Za-z_][A-Za-z0-9_]*$");
  /** JSON-born VARIANTs hold no timestamps: the zone writes nothing. */
  private static final ZoneId ZONE = ZoneOffset.UTC;

  private transient volatile String cachedDdl;
  private transient volatile StructType cachedType;

  @Override
  public String call(String text, Row typed, Boolean rejected, String ddl) {
    if (text == null) {
      return null;
    }
    Variant record;
    try {
      record = VariantBuilder.parseJson(text, false, true);  // try_parse_json's call
    } catch (Exception refused) {
      return null;
    }
    if (record.getType() != VariantUtil.Type.OBJECT) {
      return null;
    }
    StructType declared = type(ddl);
    if (!Boolean.TRUE.equals(rejected) && clean(declared, record)) {
      return "";  // no misfit (Spark's typed parse flags each) and no new key: nothing walked
    }
    List<String> paths = new ArrayList<>();
    List<Variant> values = new ArrayList<>();
    struct(declared, record, typed, "", paths, values);
    if (paths.isEmpty()) {
      return "";
    }
    StringWriter out = new StringWriter();
    try (JsonGenerator generator = FACTORY.createGenerator(out)) {
      generator.writeStartObject();
      for (int i = 0; i < paths.size(); i++) {
        generator.writeFieldName(paths.get(i));
        generator.writeRawValue(values.get(i).toJson(ZONE));
      }
      generator.writeEndObject();
    } catch (IOException impossible) {
      throw new UncheckedIOException(impossible);
    }
    return out.toString();
  }

  private StructType type(String ddl) {
    String known = cachedDdl;
    StructType type = cachedType;
    if (type != null && (known == ddl || ddl.equals(known))) {
      return type;
    }
    type = StructType.fromDDL(ddl);
    cachedType = type;
    cachedDdl = ddl;
    return type;
  }

  private static boolean isObject(Variant value) {
    return value != null && value.getType() == VariantUtil.Type.OBJECT;
  }

  private static boolean isArray(Variant value) {
    return value != null && value.getType() == VariantUtil.Type.ARRAY;
  }

  private static boolean present(Variant value) {
    return value != null && value.getType() != VariantUtil.Type.NULL;
  }

  /** {@code _clean_or_true}: no key its type does not declare, at any depth (a value of another shape is clean). */
  private static boolean clean(DataType type, Variant raw) {
    if (type instanceof StructType struct) {
      if (!isObject(raw)) {
        return true;
      }
      for (int i = 0; i < raw.objectSize(); i++) {
        if (!struct.getFieldIndex(raw.getFieldAtIndex(i).key).isDefined()) {
          return false;
        }
      }
      for (StructField field : struct.fields()) {
        if (!clean(field.dataType(), raw.getFieldByKey(field.name()))) {
          return false;
        }
      }
      return true;
    }
    if (type instanceof ArrayType array && isArray(raw)) {
      for (int i = 0; i < raw.arraySize(); i++) {
        if (!clean(array.elementType(), raw.getElementAtIndex(i))) {
          return false;
        }
      }
      return true;
    }
    if (type instanceof MapType map && map.keyType() instanceof StringType && isObject(raw)) {
      for (int i = 0; i < raw.objectSize(); i++) {
        if (!clean(map.valueType(), raw.getFieldAtIndex(i).value)) {
          return false;
        }
      }
    }
    return true;
  }

  /** {@code _entries}: what {@code raw} holds under {@code type} that {@code typed} lacks, appended in order. */
  private static void entries(DataType type, Variant raw, Object typed, String path, List<String> paths,
                              List<Variant> values) {
    if (type instanceof StringType) {
      return;  // a string takes any JSON value as its text
    }
    if (typed == null && present(raw)) {
      paths.add(path);
      values.add(raw);
      return;
    }
    if (type instanceof StructType struct) {
      struct(struct, raw, (Row) typed, path, paths, values);
    } else if (type instanceof ArrayType array && !(array.elementType() instanceof StringType)) {
      if (isArray(raw)) {
        for (int i = 0; i < raw.arraySize(); i++) {
          entries(array.elementType(), raw.getElementAtIndex(i), element(typed, i), path + "[" + i + "]", paths,
                  values);
        }
      }
    } else if (type instanceof MapType map && map.keyType() instanceof StringType
               && !(map.valueType() instanceof StringType)) {
      if (isObject(raw)) {
        for (int i = 0; i < raw.objectSize(); i++) {
          Variant.ObjectField field = raw.getFieldAtIndex(i);
          entries(map.valueType(), field.value, value(typed, field.key), child(path, field.key), paths, values);
        }
      }
    }
  }

  /** {@code _struct_entries}: an object's new keys (in the VARIANT's order), then what its declared fields hide. */
  private static void struct(StructType type, Variant raw, Row typed, String path, List<String> paths,
                             List<Variant> values) {
    boolean object = isObject(raw);
    if (object) {
      for (int i = 0; i < raw.objectSize(); i++) {
        Variant.ObjectField field = raw.getFieldAtIndex(i);
        if (!type.getFieldIndex(field.key).isDefined()) {
          paths.add(child(path, field.key));
          values.add(field.value);
        }
      }
    }
    StructField[] fields = type.fields();
    for (int i = 0; i < fields.length; i++) {
      Variant value = object ? raw.getFieldByKey(fields[i].name()) : null;
      Object typedValue = typed == null || typed.isNullAt(i) ? null : typed.get(i);
      entries(fields[i].dataType(), value, typedValue, child(path, fields[i].name()), paths, values);
    }
  }

  /** {@code try_element_at(typed, index + 1)}. */
  private static Object element(Object typed, int index) {
    if (typed instanceof scala.collection.Seq<?> seq) {
      return index < seq.length() ? seq.apply(index) : null;
    }
    if (typed instanceof List<?> list) {
      return index < list.size() ? list.get(index) : null;
    }
    return null;
  }

  /** {@code try_element_at(typed, key)}. */
  @SuppressWarnings("unchecked")
  private static Object value(Object typed, String key) {
    if (typed instanceof scala.collection.Map<?, ?> map) {
      scala.Option<?> found = ((scala.collection.Map<Object, ?>) map).get(key);
      return found.isDefined() ? found.get() : null;
    }
    if (typed instanceof java.util.Map<?, ?> map) {
      return map.get(key);
    }
    return null;
  }

  /** {@code _child_path}: {@code parent.name}, a name that is no identifier quoted with backticks. */
  private static String child(String path, String name) {
    String quoted = IDENTIFIER.matcher(name).find() ? name : "`" + name.replace("`", "``") + "`";
    return path.isEmpty() ? quoted : path + "." + quoted;
  }
}
