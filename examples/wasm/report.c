/* report: sums the numbers in /input/numbers.txt, writes /output/result.txt, and shows
 * that /private (not in the manifest) and writing /input (read-only) are refused. */
#include <errno.h>
#include <stdio.h>

int main(void) {
    FILE *in = fopen("/input/numbers.txt", "r");
    if (in == NULL) { printf("read input: errno %d\n", errno); return 1; }
    long total = 0, n;
    while (fscanf(in, "%ld", &n) == 1) { total += n; }
    fclose(in);
    printf("read input: ok (sum %ld)\n", total);

    FILE *out = fopen("/output/result.txt", "w");
    if (out == NULL) { printf("write output: errno %d\n", errno); return 1; }
    fprintf(out, "sum=%ld\n", total);
    fclose(out);
    printf("write output: ok\n");

    FILE *ro = fopen("/input/tamper.txt", "w");
    printf("write input: %s (errno %d)\n", ro == NULL ? "refused" : "ALLOWED", ro == NULL ? errno : 0);
    FILE *priv = fopen("/private/notes.txt", "r");
    printf("read private: %s (errno %d)\n", priv == NULL ? "refused" : "ALLOWED", priv == NULL ? errno : 0);
    return (ro == NULL && priv == NULL) ? 0 : 1;
}
