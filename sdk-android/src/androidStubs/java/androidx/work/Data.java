package androidx.work;

import java.util.HashMap;
import java.util.Map;

/** Stub of androidx.work.Data: a key-value map. */
public final class Data {
    private final Map<String, Object> values;

    Data(Map<String, Object> values) { this.values = new HashMap<>(values); }

    public Map<String, Object> getKeyValueMap() { return new HashMap<>(values); }
    public int getInt(String key, int fallback) { Object v = values.get(key); return v instanceof Integer ? (Integer) v : fallback; }
    public long getLong(String key, long fallback) { Object v = values.get(key); return v instanceof Long ? (Long) v : fallback; }
    public float getFloat(String key, float fallback) { Object v = values.get(key); return v instanceof Float ? (Float) v : fallback; }
    public String getString(String key) { Object v = values.get(key); return v instanceof String ? (String) v : null; }

    public static final class Builder {
        private final Map<String, Object> values = new HashMap<>();
        public Builder putInt(String key, int value) { values.put(key, value); return this; }
        public Builder putLong(String key, long value) { values.put(key, value); return this; }
        public Builder putFloat(String key, float value) { values.put(key, value); return this; }
        public Builder putString(String key, String value) { values.put(key, value); return this; }
        public Data build() { return new Data(values); }
    }
}
