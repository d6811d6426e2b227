"""The Spark SQL functions catalog SQL may call: an allowlist, by the groups of Spark's own function registry.

Catalog SQL is one row's expression (or, in an aggregate's measures, one group's), so it gets the functions that
compute a value from the values they are given, and nothing that reaches outside the row: no reflection (``reflect``,
``java_method``, ``try_reflect`` call any JVM method), no error text of the author's (``raise_error``,
``assert_true``: it reaches the task log and the run log), nothing that reads the session, the user or the files
(``current_user``, ``input_file_name``, ``version``), no keys (``aes_encrypt``), no file or class descriptors
(``from_protobuf``, ``from_avro``), no XML parser (``xpath``, ``from_xml``), no generators or table functions (a row
in must be a row out), no windows (a stream's windows are its ``aggregate`` section's), and nothing random
(``rand``, ``uuid``, ``shuffle``: a replayed batch must write the same rows).

The lists were taken from Spark 4.2's ``FunctionRegistry.builtin`` (each function's ``ExpressionInfo`` group) and
then pruned by hand; a function added to Spark later is refused until it is added here on purpose.
"""

from __future__ import annotations

_STRING = """
ascii base64 bit_length btrim char char_length character_length chr collate collation concat_ws contains decode elt
encode endswith find_in_set format_number format_string initcap instr is_valid_utf8 lcase left len length levenshtein
locate lower lpad ltrim luhn_check make_valid_utf8 mask octet_length overlay position printf quote regexp_count
regexp_extract regexp_extract_all regexp_instr regexp_replace regexp_substr repeat replace right rpad rtrim sentences
soundex space split split_part startswith substr substring substring_index to_binary to_char to_number to_varchar
translate trim try_to_binary try_to_number try_validate_utf8 ucase unbase64 upper validate_utf8
"""
_MATH = """
abs acos acosh asin asinh atan atan2 atanh bin bround cbrt ceil ceiling conv cos cosh cot csc degrees div e exp expm1
factorial floor greatest hex hypot least ln log log10 log1p log2 mod negative pi pmod positive pow power radians rint
round sec sign signum sin sinh sqrt tan tanh try_add try_divide try_mod try_multiply try_subtract unhex width_bucket
"""
# Without window, window_time and session_window: a stream's windows are its aggregate section's.
_DATETIME = """
add_months convert_timezone curdate current_date current_time current_timestamp current_timezone date_add date_diff
date_format date_from_unix_date date_part date_sub date_trunc dateadd datediff datepart day dayname dayofmonth
dayofweek dayofyear extract from_unixtime from_utc_timestamp hour last_day localtimestamp make_date make_dt_interval
make_interval make_time make_timestamp make_timestamp_ltz make_timestamp_ntz make_ym_interval minute month monthname
months_between next_day now quarter second time_bucket time_diff time_from_micros time_from_millis time_from_seconds
time_to_micros time_to_millis time_to_seconds time_trunc timestamp_micros timestamp_millis timestamp_seconds to_date
to_time to_timestamp to_timestamp_ltz to_timestamp_ntz to_unix_timestamp to_utc_timestamp trunc try_make_interval
try_make_timestamp try_make_timestamp_ltz try_make_timestamp_ntz try_to_date try_to_time try_to_timestamp unix_date
unix_micros unix_millis unix_seconds unix_timestamp weekday weekofyear year
"""
_CONDITIONAL = "coalesce if ifnull nanvl nullif nullifzero nvl nvl2 zeroifnull"
_PREDICATE = "and equal_null ilike isnan isnotnull isnull like not or regexp regexp_like rlike"
_CONVERSION = "bigint binary boolean cast date decimal double float int smallint string time timestamp tinyint"
_COLLECTION = "cardinality concat element_at reverse size try_element_at"
# Without shuffle (random).
_ARRAY = """
array array_append array_compact array_contains array_distinct array_except array_insert array_intersect array_join
array_max array_min array_position array_prepend array_remove array_repeat array_size array_union arrays_overlap
arrays_zip flatten get sequence slice sort_array
"""
_MAP = """
map map_concat map_contains_key map_entries map_from_arrays map_from_entries map_keys map_values str_to_map
"""
_STRUCT = "named_struct struct"
_LAMBDA = "aggregate array_sort exists filter forall map_filter map_zip_with reduce transform transform_keys " \
          "transform_values zip_with"
# Without json_tuple (a generator).
_JSON = "from_json get_json_object json_array_length json_object_keys schema_of_json to_json"
# Without schema_of_variant_agg (an aggregate).
_VARIANT = """
is_valid_variant is_variant_null parse_json schema_of_variant to_variant_object try_parse_json try_variant_get
variant_get
"""
_CSV = "from_csv schema_of_csv to_csv"
_URL = "parse_url try_parse_url try_url_decode url_decode url_encode"
_HASH = "crc32 hash md5 sha sha1 sha2 xxhash64"
_BITWISE = "bit_count bit_get getbit shiftleft shiftright shiftrightunsigned"
_MISC = "typeof"
# Written like functions but parsed as syntax: CAST(x AS t), TRY_CAST, EXTRACT(f FROM x)...
_SYNTAX = "try_cast"

ROW_FUNCTIONS = frozenset(" ".join((_STRING, _MATH, _DATETIME, _CONDITIONAL, _PREDICATE, _CONVERSION, _COLLECTION,
                                    _ARRAY, _MAP, _STRUCT, _LAMBDA, _JSON, _VARIANT, _CSV, _URL, _HASH, _BITWISE, _MISC,
                                    _SYNTAX)).split())

#: What an aggregate's measure may call (``revenue: sum(amount)``), and nowhere else.
AGGREGATE_FUNCTIONS = frozenset({"count", "sum", "min", "max", "avg", "approx_count_distinct"})

#: Keywords that may stand before a parenthesis without calling a function: ``x IN (1, 2)``, ``CAST(x AS
#: DECIMAL(10, 2))``, ``EXTRACT(DAY FROM (ts))``, ``TRIM(BOTH FROM (s))``, ``a AND (b OR c)``, ``* EXCEPT (c)``.
SYNTAX_BEFORE_PARENTHESIS = frozenset({
    "in", "and", "or", "not", "is", "as", "case", "when", "then", "else", "like", "ilike", "rlike", "regexp",
    "between", "from", "for", "placing", "both", "leading", "trailing", "escape", "div", "decimal", "dec", "numeric",
    "char", "varchar", "interval", "except",
})
