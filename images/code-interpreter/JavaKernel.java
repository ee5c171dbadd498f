// The Java side of kernel.py: one JVM per context, its cells evaluated by JShell (in this JVM,
// so that its state lives as long as the process). A cell comes as a line: its code in hex, then
// its variables as `name:value` pairs in hex, comma-separated, which the cell sees as system
// properties (as E2B's Java kernel gives them), put back after it. The answer is E2B's NDJSON
// messages on stdout, then {"type": "end_of_cell"}; a cell's value is its last snippet's, a
// string as its text (as E2B's shows it).
import java.io.BufferedReader;
import java.io.FileDescriptor;
import java.io.FileOutputStream;
import java.io.InputStreamReader;
import java.io.OutputStream;
import java.io.PrintStream;
import java.nio.charset.StandardCharsets;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.stream.Collectors;
import jdk.jshell.Diag;
import jdk.jshell.EvalException;
import jdk.jshell.ExpressionSnippet;
import jdk.jshell.JShell;
import jdk.jshell.Snippet;
import jdk.jshell.SnippetEvent;
import jdk.jshell.SourceCodeAnalysis;
import jdk.jshell.VarSnippet;

public class JavaKernel {
  private static final PrintStream PROTOCOL = new PrintStream(new FileOutputStream(FileDescriptor.out), true, StandardCharsets.UTF_8);

  static String json(String s) {
    StringBuilder b = new StringBuilder("\"");
    for (char c : s.toCharArray()) {
      switch (c) {
        case '"' -> b.append("\\\"");
        case '\\' -> b.append("\\\\");
        case '\n' -> b.append("\\n");
        case '\r' -> b.append("\\r");
        case '\t' -> b.append("\\t");
        default -> {
          if (c < 0x20) b.append(String.format("\\u%04x", (int) c));
          else b.append(c);
        }
      }
    }
    return b.append('"').toString();
  }

  static synchronized void emit(String type, String... fields) {
    StringBuilder b = new StringBuilder("{\"type\":").append(json(type));
    for (int i = 0; i + 1 < fields.length; i += 2) {
      b.append(',').append(json(fields[i])).append(':');
      b.append(fields[i].equals("is_main_result") ? fields[i + 1] : json(fields[i + 1]));
    }
    PROTOCOL.println(b.append('}'));
    PROTOCOL.flush();
  }

  /** A stream a cell writes to, told as E2B's stdout or stderr messages a write at a time: a
   * `println` is two, its text and the line's end (a subclass of PrintStream writes them apart),
   * as E2B's Java kernel tells them. */
  static PrintStream relay(String type) {
    OutputStream sink = new OutputStream() {
      @Override public void write(int b) {
        write(new byte[] {(byte) b}, 0, 1);
      }
      @Override public void write(byte[] b, int off, int len) {
        if (len > 0) emit(type, "text", new String(b, off, len, StandardCharsets.UTF_8));
      }
    };
    return new PrintStream(sink, true, StandardCharsets.UTF_8) {};
  }

  static String unhex(String h) {
    byte[] out = new byte[h.length() / 2];
    for (int i = 0; i < out.length; i++) out[i] = (byte) Integer.parseInt(h.substring(2 * i, 2 * i + 2), 16);
    return new String(out, StandardCharsets.UTF_8);
  }

  /** A value as E2B's shows it: JShell quotes a string; its text is without them. */
  static String shown(Snippet snippet, String value) {
    String type = snippet instanceof ExpressionSnippet e ? e.typeName() : snippet instanceof VarSnippet v ? v.typeName() : "";
    if (type.equals("String") && value.length() >= 2 && value.startsWith("\"") && value.endsWith("\"")) {
      return value.substring(1, value.length() - 1).replace("\\n", "\n").replace("\\t", "\t").replace("\\\"", "\"").replace("\\\\", "\\");
    }
    return value;
  }

  static boolean runCell(JShell shell, String code) {
    SourceCodeAnalysis analysis = shell.sourceCodeAnalysis();
    String rest = code;
    String last = null;
    while (!rest.isBlank()) {
      SourceCodeAnalysis.CompletionInfo info = analysis.analyzeCompletion(rest);
      String source = info.source() != null ? info.source() : rest;
      rest = info.source() != null ? info.remaining() : "";
      last = null;
      for (SnippetEvent event : shell.eval(source)) {
        if (event.causeSnippet() != null) continue;
        if (event.status() == Snippet.Status.REJECTED) {
          List<Diag> diags = shell.diagnostics(event.snippet()).collect(Collectors.toList());
          String message = diags.stream().map(d -> d.getMessage(null)).collect(Collectors.joining("\n"));
          emit("error", "name", "CompilationError", "value", message, "traceback", message);
          return false;
        }
        if (event.exception() != null) {
          Throwable t = event.exception();
          String name = t instanceof EvalException ee ? ee.getExceptionClassName() : t.getClass().getName();
          String message = t.getMessage() == null ? "" : t.getMessage();
          emit("error", "name", name, "value", message, "traceback", name + ": " + message);
          return false;
        }
        if (event.value() != null && (event.snippet() instanceof ExpressionSnippet || event.snippet().subKind() == Snippet.SubKind.TEMP_VAR_EXPRESSION_SUBKIND)) {
          last = shown(event.snippet(), event.value());
        }
      }
    }
    System.out.flush();
    System.err.flush();
    if (last != null) emit("result", "text", last, "is_main_result", "true");
    return true;
  }

  public static void main(String[] args) throws Exception {
    System.setOut(relay("stdout"));
    System.setErr(relay("stderr"));
    JShell shell = JShell.builder().executionEngine("local").out(System.out).err(System.err).build();
    BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8));
    for (String line; (line = in.readLine()) != null; ) {
      String[] fields = line.split(" ", -1);
      String code = fields.length > 0 ? unhex(fields[0]) : "";
      Map<String, String> before = new HashMap<>();
      if (fields.length > 1 && !fields[1].isEmpty()) {
        for (String pair : fields[1].split(",")) {
          String[] kv = pair.split(":", -1);
          String key = unhex(kv[0]);
          before.put(key, System.getProperty(key));
          System.setProperty(key, kv.length > 1 ? unhex(kv[1]) : "");
        }
      }
      try {
        runCell(shell, code);
      } catch (RuntimeException e) {
        emit("error", "name", e.getClass().getName(), "value", String.valueOf(e.getMessage()), "traceback", String.valueOf(e));
      } finally {
        before.forEach((k, v) -> {
          if (v == null) System.clearProperty(k);
          else System.setProperty(k, v);
        });
      }
      emit("end_of_cell");
    }
  }
}
