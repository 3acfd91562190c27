// A JVM at work for tests/compat/java.txt: a pool of threads allocating, a loop whose
// null dereferences the JVM turns into NullPointerExceptions (its own SIGSEGV handler),
// children started with ProcessBuilder (posix_spawn of the JDK's jspawnhelper, which
// execs sh), explicit collections (JVM_GC), the same output every run.
//   java Spawner.java [ROUNDS] [PAUSE_MS]
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;

public class Spawner {
    static Object sometimes(int i) { return i % 3 == 0 ? null : Integer.valueOf(i); }

    public static void main(String[] args) throws Exception {
        int rounds = args.length > 0 ? Integer.parseInt(args[0]) : 20;
        int pause = args.length > 1 ? Integer.parseInt(args[1]) : 0;
        ExecutorService pool = Executors.newFixedThreadPool(4);
        List<Future<Long>> work = new ArrayList<>();
        for (int t = 0; t < 8; t++) {
            final int id = t;
            work.add(pool.submit(() -> {
                long sum = 0;
                for (int i = 0; i < 100000; i++) sum += new StringBuilder().append(i).append('/').append(id).length();
                return sum;
            }));
        }
        long npe = 0;
        for (int i = 0; i < 300000; i++) {
            try {
                sometimes(i).hashCode();
            } catch (NullPointerException e) {
                npe++;
            }
        }
        long sum = 0;
        for (Future<Long> f : work) sum += f.get();
        pool.shutdown();
        int ok = 0;
        for (int r = 0; r < rounds; r++) {
            Process p = new ProcessBuilder("sh", "-c", "echo child " + r).redirectErrorStream(true).start();
            try (BufferedReader in = new BufferedReader(new InputStreamReader(p.getInputStream()))) {
                String line = in.readLine();
                if (p.waitFor() == 0 && ("child " + r).equals(line)) ok++;
            }
            if (r % 10 == 0) System.gc();
            if (pause > 0) Thread.sleep(pause);
        }
        System.out.println("threads sum " + sum);
        System.out.println("null pointer exceptions " + npe);
        System.out.println("children " + ok + " of " + rounds);
        System.out.println("done");
    }
}
