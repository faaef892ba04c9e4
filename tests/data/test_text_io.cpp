// Line reading (plain and gzip, CRLF, Latin-1 bytes), TSV/SST-2 parsing and its errors, and the
// shipped datasets as their README describes them.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "core/error.h"
#include "data/text_io.h"
#include "data/tsv_dataset.h"
#include "data/unicode.h"
#include "test_util.h"

namespace fs = std::filesystem;
using namespace ember::data;

namespace {

std::string source_path(const std::string& rel) { return std::string(EMBER_SOURCE_DIR) + "/" + rel; }

// A fresh directory per test, removed afterwards.
class TextIoTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path() /
           ("ember_text_io_" + std::to_string(getpid()) + "_" + info->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& content, bool gzip = false) {
    std::string path = (dir_ / name).string();
    write_text_file(path, content, gzip);
    return path;
  }
  fs::path dir_;
};

std::vector<std::string> lines_of(const std::string& path) { return read_lines(path); }

}  // namespace

TEST_F(TextIoTest, LfCrlfAndMissingFinalNewline) {
  const std::vector<std::string> want = {"first", "", "third line", "last"};
  EXPECT_EQ(lines_of(write("lf.txt", "first\n\nthird line\nlast\n")), want);
  EXPECT_EQ(lines_of(write("crlf.txt", "first\r\n\r\nthird line\r\nlast\r\n")), want);
  EXPECT_EQ(lines_of(write("nofinal.txt", "first\n\nthird line\nlast")), want);
  EXPECT_EQ(lines_of(write("nofinal_cr.txt", "first\r\n\r\nthird line\r\nlast\r")), want);
  // A carriage return inside a line is kept: only line endings are removed.
  EXPECT_EQ(lines_of(write("inner_cr.txt", "a\rb\n")), std::vector<std::string>{"a\rb"});
}

TEST_F(TextIoTest, EmptyFileAndBlankLines) {
  EXPECT_TRUE(lines_of(write("empty.txt", "")).empty());
  EXPECT_EQ(lines_of(write("one_newline.txt", "\n")), std::vector<std::string>{""});
  EXPECT_EQ(read_lines(write("blanks.txt", " \n\na\n \t \nb\n"), /*skip_blank=*/true),
            (std::vector<std::string>{"a", "b"}));
}

TEST_F(TextIoTest, GzipAndPlainGiveTheSameLines) {
  std::string content;
  for (int i = 0; i < 5000; ++i) content += "line " + std::to_string(i) + (i % 3 ? "\r\n" : "\n");
  const std::string plain = write("plain.txt", content);
  const std::string gz = write("packed.txt.gz", content, /*gzip=*/true);
  EXPECT_NE(fs::file_size(plain), fs::file_size(gz));  // really compressed
  const auto a = lines_of(plain), b = lines_of(gz);
  ASSERT_EQ(a.size(), 5000u);
  EXPECT_EQ(a, b);
  EXPECT_EQ(a[4999], "line 4999");
  // Detection is by content: a gzip file without .gz suffix and a plain one with it both work.
  EXPECT_EQ(lines_of(write("no_suffix", content, true)), a);
  EXPECT_EQ(lines_of(write("fake.gz", content, false)), a);
}

TEST_F(TextIoTest, LinesLongerThanTheReadChunk) {
  const std::string long_line(1'000'003, 'x');
  const std::string content = "short\n" + long_line + "\r\nend";
  for (bool gz : {false, true}) {
    const auto lines = lines_of(write(gz ? "long.gz" : "long.txt", content, gz));
    ASSERT_EQ(lines.size(), 3u);
    EXPECT_EQ(lines[1], long_line);
    EXPECT_EQ(lines[2], "end");
  }
}

TEST_F(TextIoTest, Latin1BytesBecomeUtf8) {
  // 0xE9 = e acute, 0xE6 = ae, 0xF0 = eth in ISO-8859-1; valid UTF-8 around them is kept.
  const std::string path = write("latin1.txt", "caf\xe9\nC\xe6sar \xc3\xa9t\xe9\n\xf0\n");
  LineReader reader(path);
  std::string line;
  ASSERT_TRUE(reader.next(line));
  EXPECT_EQ(line, "caf\xc3\xa9");
  ASSERT_TRUE(reader.next(line));
  EXPECT_EQ(line, "C\xc3\xa6sar \xc3\xa9t\xc3\xa9");
  ASSERT_TRUE(reader.next(line));
  EXPECT_EQ(line, "\xc3\xb0");
  EXPECT_FALSE(reader.next(line));
  EXPECT_EQ(reader.latin1_bytes(), 4);
  EXPECT_EQ(reader.line_number(), 3);
}

TEST_F(TextIoTest, Latin1FallbackKeepsEveryByte) {
  // A truncated UTF-8 sequence followed by ASCII: both bytes of the broken prefix survive.
  int64_t n = 0;
  EXPECT_EQ(latin1_fallback_to_utf8("a\xe2\x82z", &n), "a\xc3\xa2\xc2\x82z");
  EXPECT_EQ(n, 2);
  EXPECT_EQ(latin1_fallback_to_utf8("plain \xe2\x82\xac", &n), "plain \xe2\x82\xac");
  EXPECT_EQ(n, 2);
  for (int b = 0x80; b < 0x100; ++b) {
    const std::string out = latin1_fallback_to_utf8(std::string(1, char(b)));
    EXPECT_TRUE(unicode::is_valid_utf8(out)) << b;
    EXPECT_EQ(unicode::decode_utf8(out), std::u32string(1, char32_t(b))) << b;
  }
}

TEST_F(TextIoTest, StrictUtf8PolicyNamesFileAndLine) {
  const std::string path = write("bad.txt", "ok\nfine\nbad \xff here\n");
  EXPECT_EMBER_ERROR(read_lines(path, false, InvalidUtf8Policy::Error), "bad.txt:3", "not valid UTF-8");
}

TEST_F(TextIoTest, ByteOrderMarkIsDropped) {
  EXPECT_EQ(lines_of(write("bom.txt", "\xef\xbb\xbfhead\nx\xef\xbb\xbf\n")),
            (std::vector<std::string>{"head", "x\xef\xbb\xbf"}));
}

TEST_F(TextIoTest, MissingFileAndDirectory) {
  EXPECT_EMBER_ERROR(LineReader((dir_ / "nope.txt").string()), "nope.txt", "file not found");
  EXPECT_EMBER_ERROR(read_lines(dir_.string()), "is a directory");
  EXPECT_EMBER_ERROR(read_labeled_tsv((dir_ / "nope.tsv").string()), "nope.tsv", "file not found");
}

TEST_F(TextIoTest, TruncatedAndCorruptGzip) {
  std::string content;
  for (int i = 0; i < 20000; ++i) content += "row " + std::to_string(i * 7919 % 10007) + "\n";
  const std::string gz = write("full.gz", content, true);
  {
    LineReader probe(gz);  // sanity: the full file reads
    std::string l;
    int n = 0;
    while (probe.next(l)) ++n;
    EXPECT_EQ(n, 20000);
  }
  const auto size = fs::file_size(gz);
  fs::copy_file(gz, dir_ / "cut.gz");
  fs::resize_file(dir_ / "cut.gz", size / 2);
  EXPECT_EMBER_ERROR(read_lines((dir_ / "cut.gz").string()), "cut.gz", "truncated");

  // Flip bytes in the middle of the deflate stream.
  FILE* f = std::fopen(gz.c_str(), "r+b");
  ASSERT_NE(f, nullptr);
  std::fseek(f, long(size / 2), SEEK_SET);
  const char junk[16] = {'\xde', '\xad', '\xbe', '\xef', 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11};
  std::fwrite(junk, 1, sizeof junk, f);
  std::fclose(f);
  EXPECT_EMBER_ERROR(read_lines(gz), "full.gz");
}

// ---- TSV

TEST_F(TextIoTest, Sst2FormatSpaceBeforeTabAndCrlf) {
  const std::string body =
      "sentence\tlabel\n"
      "it 's a charming and often affecting journey . \t1\n"
      "unflinchingly bleak and desperate \t0\n"
      "\n"
      "no trailing space\t1\n"
      "two spaces  \t 0 \n";
  for (bool crlf : {false, true}) {
    for (bool gz : {false, true}) {
      std::string content = body;
      if (crlf) {
        content.clear();
        for (char c : body) content += c == '\n' ? std::string("\r\n") : std::string(1, c);
      }
      const LabeledTexts data = read_labeled_tsv(write("sst.tsv", content, gz));
      ASSERT_EQ(data.size(), 4);
      EXPECT_EQ(data.texts[0], "it 's a charming and often affecting journey .");
      EXPECT_EQ(data.texts[1], "unflinchingly bleak and desperate");
      EXPECT_EQ(data.texts[2], "no trailing space");
      EXPECT_EQ(data.texts[3], "two spaces");
      EXPECT_EQ(data.labels, (std::vector<int64_t>{1, 0, 1, 0}));
      EXPECT_EQ(data.label_counts(), (std::vector<int64_t>{2, 2}));
    }
  }
}

TEST_F(TextIoTest, TsvLatin1TextIsDecoded) {
  const LabeledTexts data = read_labeled_tsv(write("l1.tsv", "sentence\tlabel\nna\xefve caf\xe9 \t1\n"));
  ASSERT_EQ(data.size(), 1);
  EXPECT_EQ(data.texts[0], "na\xc3\xafve caf\xc3\xa9");
}

TEST_F(TextIoTest, TsvColumnsFoundByHeaderName) {
  const LabeledTexts data =
      read_labeled_tsv(write("swapped.tsv", "label\tid\tsentence\n1\t7\tgood\n0\t8\tbad \n"));
  EXPECT_EQ(data.texts, (std::vector<std::string>{"good", "bad"}));
  EXPECT_EQ(data.labels, (std::vector<int64_t>{1, 0}));
  EXPECT_EMBER_ERROR(read_labeled_tsv(write("nohead.tsv", "text\tlabel\na\t1\n")), "nohead.tsv:1",
                     "no column 'sentence'", "'text', 'label'");
}

TEST_F(TextIoTest, TsvWithoutHeaderUsesPositions) {
  LabeledTsvOptions opt;
  opt.has_header = false;
  opt.text_index = 1;
  opt.label_index = 0;
  opt.num_labels = 6;
  const LabeledTexts data = read_labeled_tsv(write("pos.tsv", "5\tfirst\n0\tsecond\n"), opt);
  EXPECT_EQ(data.texts, (std::vector<std::string>{"first", "second"}));
  EXPECT_EQ(data.labels, (std::vector<int64_t>{5, 0}));
}

TEST_F(TextIoTest, WrongColumnCountNamesFileAndLine) {
  const std::string path = write("cols.tsv", "sentence\tlabel\ngood \t1\n\ntab\tinside \t0\n");
  EXPECT_EMBER_ERROR(read_labeled_tsv(path), "cols.tsv:4", "expected 2", "found 3");
  EXPECT_EMBER_ERROR(read_labeled_tsv(write("one.tsv", "sentence\tlabel\nno label here\n")), "one.tsv:2",
                     "expected 2", "found 1");
  EXPECT_EMBER_ERROR(read_tsv(write("raw.tsv", "a\tb\tc\n1\t2\t3\n1\t2\n", true)), "raw.tsv:3", "expected 3",
                     "found 2");
}

TEST_F(TextIoTest, BadLabelNamesFileAndLine) {
  const char* bad[] = {"x", "", "1.0", "2", "-1", "1a", "0x1", "99999999999999999999"};
  for (const char* label : bad) {
    const std::string path = write("lab.tsv", std::string("sentence\tlabel\nfine \t0\nthis one \t") + label + "\n");
    EXPECT_EMBER_ERROR(read_labeled_tsv(path), "lab.tsv:3", "bad label '" + std::string(label) + "'",
                       "[0, 2)");
  }
  // num_labels <= 0 accepts any non-negative integer below kMaxLabels.
  LabeledTsvOptions any;
  any.num_labels = 0;
  EXPECT_EQ(read_labeled_tsv(write("big.tsv", "sentence\tlabel\na\t41\n"), any).labels,
            std::vector<int64_t>{41});
}

TEST_F(TextIoTest, EmptyTsvIsAnError) {
  EXPECT_EMBER_ERROR(read_labeled_tsv(write("empty.tsv", "")), "empty.tsv", "empty");
  EXPECT_EQ(read_labeled_tsv(write("header_only.tsv", "sentence\tlabel\n")).size(), 0);
}

// ---- the shipped data, as datasets/README.md describes it

TEST(ShippedData, Sst2Splits) {
  const LabeledTexts dev = read_labeled_tsv(source_path("datasets/sst2/dev.tsv.gz"));
  EXPECT_EQ(dev.size(), 872);
  EXPECT_EQ(dev.label_counts(), (std::vector<int64_t>{428, 444}));
  EXPECT_EQ(dev.texts[0], "it 's a charming and often affecting journey .");
  const LabeledTexts train = read_labeled_tsv(source_path("datasets/sst2/train.tsv.gz"));
  EXPECT_EQ(train.size(), 67349);
  EXPECT_EQ(train.label_counts(), (std::vector<int64_t>{29780, 37569}));
  for (const auto* set : {&dev, &train})
    for (const std::string& t : set->texts) {
      ASSERT_FALSE(t.empty());
      ASSERT_NE(t.back(), ' ');
    }
}

TEST(ShippedData, CorporaDecodeCleanly) {
  // WikiText is CRLF; the reader removes every '\r'.
  const auto valid = read_lines(source_path("datasets/corpus/wikitext2_raw_valid.txt.gz"));
  EXPECT_EQ(valid.size(), 3760u);
  const auto test = read_lines(source_path("datasets/corpus/wikitext2_raw_test.txt.gz"));
  EXPECT_EQ(test.size(), 2891u);
  for (const auto* lines : {&valid, &test})
    for (const std::string& l : *lines) ASSERT_EQ(l.find('\r'), std::string::npos);

  // Two Gutenberg books carry ISO-8859-1 bytes: read as Latin-1, all lines valid UTF-8.
  for (const char* book : {"chesterton-ball", "shakespeare-caesar"}) {
    LineReader reader(source_path(std::string("datasets/corpus/gutenberg/") + book + ".txt.gz"));
    std::string line;
    while (reader.next(line)) ASSERT_TRUE(unicode::is_valid_utf8(line)) << book << ":" << reader.line_number();
    EXPECT_GT(reader.latin1_bytes(), 0) << book;
  }
  LineReader moby(source_path("datasets/corpus/gutenberg/melville-moby_dick.txt.gz"));
  std::string line;
  int64_t n = 0;
  while (moby.next(line)) {
    ASSERT_EQ(line.find('\r'), std::string::npos);
    ++n;
  }
  EXPECT_GT(n, 20000);
  EXPECT_EQ(moby.latin1_bytes(), 0);
}
